//! What a device says about its memory: the bytes this process may use of the heap that
//! buffers live in (the driver's budget, which already leaves out what other programs
//! hold) and the bytes it uses now. Vulkan reports both through `VK_EXT_memory_budget`;
//! other backends report nothing through wgpu, and the engine then falls back to a fixed
//! size (see `runner::fit`). A test or a user can make any context report a size
//! ([`GpuContext::with_memory_report`], `PAGELLM_INJECT_DEVICE_MEMORY=BYTES`).

use super::GpuContext;

/// The environment variable that makes every context report this many bytes free, as a
/// discrete GPU would (see [`GpuContext::with_memory_report`]).
pub const DEVICE_MEMORY_VAR: &str = "PAGELLM_INJECT_DEVICE_MEMORY";

/// One device's memory, as its driver reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Bytes this process may use of the device-local heap (its budget: the heap's size
    /// less what other programs hold, as the driver estimates it).
    pub budget: u64,
    /// Bytes this process uses of that heap now.
    pub usage: u64,
    /// Whether the heap is the host's own memory (a software or integrated adapter whose
    /// only heap is system RAM), which the engine does not fill by default.
    pub host_memory: bool,
    /// Where the figures come from.
    pub source: MemorySource,
}

/// Where a [`DeviceMemory`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemorySource {
    /// Vulkan's `VK_EXT_memory_budget`.
    VulkanBudget,
    /// [`GpuContext::with_memory_report`] or `PAGELLM_INJECT_DEVICE_MEMORY`.
    Injected,
}

impl DeviceMemory {
    /// Bytes still free to this process: the budget less the usage.
    pub fn available(&self) -> u64 {
        self.budget.saturating_sub(self.usage)
    }

    /// A report of `bytes` free on a discrete GPU (for injection).
    pub fn injected(bytes: u64) -> Self {
        DeviceMemory {
            budget: bytes,
            usage: 0,
            host_memory: false,
            source: MemorySource::Injected,
        }
    }
}

impl std::fmt::Display for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let source = match self.source {
            MemorySource::VulkanBudget => "VK_EXT_memory_budget",
            MemorySource::Injected => "injected",
        };
        write!(
            f,
            "{:.0} MiB free of a {:.0} MiB budget{} ({source})",
            mib(self.available()),
            mib(self.budget),
            if self.host_memory {
                ", host memory"
            } else {
                ""
            }
        )
    }
}

/// `PAGELLM_INJECT_DEVICE_MEMORY`, when it is set to a number of bytes (anything else is
/// ignored with a warning).
pub(super) fn injected_from_env() -> Option<DeviceMemory> {
    let v = std::env::var(DEVICE_MEMORY_VAR).ok()?;
    if v.trim().is_empty() {
        return None;
    }
    match v.trim().parse::<u64>() {
        Ok(bytes) => Some(DeviceMemory::injected(bytes)),
        Err(e) => {
            tracing::warn!("{DEVICE_MEMORY_VAR}={v:?} is not a number of bytes ({e}); ignored");
            None
        }
    }
}

impl GpuContext {
    /// The device's memory as its driver reports it now, or `None` where it reports
    /// nothing (every backend but Vulkan with `VK_EXT_memory_budget`, and browsers).
    pub fn memory(&self) -> Option<DeviceMemory> {
        if let Some(m) = self.memory_report {
            return Some(m);
        }
        adapter_memory(&self.adapter)
    }

    /// Makes [`Self::memory`] report `memory` (`None`: what the driver says), so that
    /// sizing the KV pool from free memory can be checked on any machine.
    /// `PAGELLM_INJECT_DEVICE_MEMORY=BYTES` sets it for every context.
    pub fn with_memory_report(mut self, memory: Option<DeviceMemory>) -> Self {
        self.memory_report = memory;
        self
    }
}

/// What `adapter`'s driver reports of its memory (see [`GpuContext::memory`]); the usage
/// is this process's on every device of the adapter.
pub fn adapter_memory(adapter: &wgpu::Adapter) -> Option<DeviceMemory> {
    let host = adapter.get_info().device_type == wgpu::DeviceType::Cpu;
    query(adapter).map(|(budget, usage)| DeviceMemory {
        budget,
        usage,
        host_memory: host,
        source: MemorySource::VulkanBudget,
    })
}

/// The budget and usage of the largest device-local heap, through wgpu's Vulkan layer.
#[cfg(all(
    not(target_arch = "wasm32"),
    any(target_os = "linux", target_os = "windows", target_os = "android")
))]
fn query(adapter: &wgpu::Adapter) -> Option<(u64, u64)> {
    use ash::vk;
    use wgpu::hal::api::Vulkan;
    // SAFETY: the hal adapter is only read (its instance, physical device and extensions)
    // while the wgpu adapter it came from is alive; the query needs no synchronisation
    // with other use of the adapter or its devices.
    let hal = unsafe { adapter.as_hal::<Vulkan>() }?;
    if !hal
        .physical_device_capabilities()
        .supports_extension(c"VK_EXT_memory_budget")
    {
        return None;
    }
    let shared = hal.shared_instance();
    // vkGetPhysicalDeviceMemoryProperties2 is core in Vulkan 1.1.
    if shared.instance_api_version() < vk::API_VERSION_1_1 {
        return None;
    }
    let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
    let mut props = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
    // SAFETY: the physical device belongs to this instance, and the chain holds the one
    // structure the enabled extension defines.
    unsafe {
        shared
            .raw_instance()
            .get_physical_device_memory_properties2(hal.raw_physical_device(), &mut props);
    }
    let heaps = props.memory_properties.memory_heap_count as usize;
    let heap_flags: Vec<vk::MemoryHeapFlags> = props.memory_properties.memory_heaps[..heaps]
        .iter()
        .map(|h| h.flags)
        .collect();
    largest_device_heap(
        &heap_flags,
        &budget.heap_budget[..heaps],
        &budget.heap_usage[..heaps],
    )
}

#[cfg(not(all(
    not(target_arch = "wasm32"),
    any(target_os = "linux", target_os = "windows", target_os = "android")
)))]
fn query(_adapter: &wgpu::Adapter) -> Option<(u64, u64)> {
    None
}

/// The (budget, usage) of the device-local heap with the largest budget, or of the
/// largest heap where none is device-local.
#[cfg(all(
    not(target_arch = "wasm32"),
    any(target_os = "linux", target_os = "windows", target_os = "android")
))]
fn largest_device_heap(
    flags: &[ash::vk::MemoryHeapFlags],
    budget: &[u64],
    usage: &[u64],
) -> Option<(u64, u64)> {
    let local = |i: &usize| flags[*i].contains(ash::vk::MemoryHeapFlags::DEVICE_LOCAL);
    let pick = |only_local: bool| {
        (0..flags.len())
            .filter(|i| !only_local || local(i))
            .max_by_key(|&i| budget[i])
    };
    let i = pick(true).or_else(|| pick(false))?;
    (budget[i] > 0).then_some((budget[i], usage[i]))
}

#[cfg(all(
    test,
    not(target_arch = "wasm32"),
    any(target_os = "linux", target_os = "windows", target_os = "android")
))]
mod tests {
    use super::*;
    use ash::vk::MemoryHeapFlags as F;

    #[test]
    fn the_largest_device_local_heap_is_the_one_reported() {
        // A discrete GPU: system RAM (host-visible, not device-local) is larger than VRAM,
        // and a small device-local BAR heap sits beside VRAM.
        let flags = [F::empty(), F::DEVICE_LOCAL, F::DEVICE_LOCAL];
        let budget = [32 << 30, 7 << 30, 200 << 20];
        let usage = [1 << 30, 3 << 30, 0];
        assert_eq!(
            largest_device_heap(&flags, &budget, &usage),
            Some((7 << 30, 3 << 30))
        );
        // No device-local heap: the largest.
        let flags = [F::empty(), F::empty()];
        assert_eq!(
            largest_device_heap(&flags, &[1 << 30, 2 << 30], &[5, 6]),
            Some((2 << 30, 6))
        );
        // A driver that fills in no budget reports nothing.
        assert_eq!(largest_device_heap(&[F::DEVICE_LOCAL], &[0], &[0]), None);
        assert_eq!(largest_device_heap(&[], &[], &[]), None);
    }

    #[test]
    fn available_is_the_budget_less_the_usage() {
        let m = DeviceMemory {
            budget: 8 << 30,
            usage: 3 << 30,
            host_memory: false,
            source: MemorySource::VulkanBudget,
        };
        assert_eq!(m.available(), 5 << 30);
        let over = DeviceMemory {
            usage: 9 << 30,
            ..m
        };
        assert_eq!(over.available(), 0);
        assert_eq!(
            m.to_string(),
            "5120 MiB free of a 8192 MiB budget (VK_EXT_memory_budget)"
        );
    }
}
