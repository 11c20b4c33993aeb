//! Adapter choice, kept free of live wgpu objects so it can be tested on any machine.
//!
//! Three knobs, read from the environment by [`AdapterRequest::from_env`]:
//! `PAGELLM_BACKEND` (or wgpu's own `WGPU_BACKEND`): a comma-separated list of backends;
//! `WGPU_ADAPTER_NAME`: a case-insensitive substring of the adapter name, matched here rather
//! than inside wgpu so that a miss is an error listing what exists instead of a panic;
//! `WGPU_POWER_PREF`: `high` (discrete first, the default) or `low` (integrated first).

use crate::error::{GpuError, Result};
use wgpu::{Backend, Backends, DeviceType, PowerPreference};

/// What the caller wants from an adapter.
#[derive(Clone, Debug)]
pub struct AdapterRequest {
    /// The backends to look on.
    pub backends: Backends,
    /// Where `backends` came from, for error messages.
    pub backends_source: Option<String>,
    /// A substring of the adapter's name (case-insensitive), if one is wanted.
    pub name_contains: Option<String>,
    /// Discrete or integrated first.
    pub power: PowerPreference,
}

impl Default for AdapterRequest {
    fn default() -> Self {
        AdapterRequest {
            backends: Backends::all(),
            backends_source: None,
            name_contains: None,
            power: PowerPreference::HighPerformance,
        }
    }
}

impl AdapterRequest {
    /// Reads `PAGELLM_BACKEND`/`WGPU_BACKEND`, `WGPU_ADAPTER_NAME` and `WGPU_POWER_PREF`.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`Self::from_env`], over any key lookup (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut req = AdapterRequest::default();
        for var in ["PAGELLM_BACKEND", "WGPU_BACKEND"] {
            if let Some(v) = get(var).filter(|v| !v.trim().is_empty()) {
                req.backends = parse_backends(var, &v)?;
                req.backends_source = Some(format!("{var}={v}"));
                break;
            }
        }
        req.name_contains = get("WGPU_ADAPTER_NAME").filter(|v| !v.trim().is_empty());
        if let Some(v) = get("WGPU_POWER_PREF").filter(|v| !v.trim().is_empty()) {
            req.power = parse_power(&v)?;
        }
        Ok(req)
    }
}

/// Parses `vulkan,gl`-style lists. Accepts the spellings wgpu documents plus a few aliases.
pub fn parse_backends(var: &str, list: &str) -> Result<Backends> {
    let mut out = Backends::empty();
    for name in list.split(',').map(|s| s.trim().to_ascii_lowercase()) {
        if name.is_empty() {
            continue;
        }
        out |= match name.as_str() {
            "vulkan" | "vk" => Backends::VULKAN,
            "metal" | "mtl" => Backends::METAL,
            "dx12" | "d3d12" => Backends::DX12,
            "gl" | "gles" | "opengl" => Backends::GL,
            "primary" => Backends::PRIMARY,
            "all" => Backends::all(),
            _ => {
                return Err(GpuError::UnknownBackend {
                    var: var.to_string(),
                    name,
                })
            }
        };
    }
    if out.is_empty() {
        return Err(GpuError::UnknownBackend {
            var: var.to_string(),
            name: list.to_string(),
        });
    }
    Ok(out)
}

fn parse_power(v: &str) -> Result<PowerPreference> {
    match v.trim().to_ascii_lowercase().as_str() {
        "high" | "high-performance" | "performance" => Ok(PowerPreference::HighPerformance),
        "low" | "low-power" => Ok(PowerPreference::LowPower),
        "none" => Ok(PowerPreference::None),
        other => Err(GpuError::UnknownPowerPreference {
            var: "WGPU_POWER_PREF".into(),
            name: other.to_string(),
        }),
    }
}

impl AdapterRequest {
    /// The index of the adapter this request picks among `adapters` (by the rules of
    /// [`choose_adapter`]). For applications whose toolkit enumerates adapters itself (for
    /// instance one filtered to those that can present to its window) and that want
    /// pagellm's choice and its `WGPU_ADAPTER_NAME`/`PAGELLM_BACKEND` handling.
    pub fn choose(&self, adapters: &[wgpu::Adapter]) -> Result<usize> {
        let summaries: Vec<AdapterSummary> = adapters
            .iter()
            .map(|a| AdapterSummary::of(&a.get_info()))
            .collect();
        choose_adapter(&summaries, self)
    }
}

/// The facts about one adapter that choice depends on.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    /// The adapter's name.
    pub name: String,
    /// Its backend.
    pub backend: Backend,
    /// Discrete, integrated, virtual, CPU.
    pub device_type: DeviceType,
}

impl AdapterSummary {
    /// The summary of an adapter's info.
    pub fn of(info: &wgpu::AdapterInfo) -> Self {
        AdapterSummary {
            name: info.name.clone(),
            backend: info.backend,
            device_type: info.device_type,
        }
    }

    /// "name (backend, type)", as errors and logs name an adapter.
    pub fn describe(&self) -> String {
        format!("{} ({:?}, {:?})", self.name, self.backend, self.device_type)
    }
}

/// Picks the index of the best adapter: filtered by name substring when asked, then ranked by
/// device type for the power preference, then by backend (native APIs before GL), then by
/// enumeration order.
pub fn choose_adapter(adapters: &[AdapterSummary], req: &AdapterRequest) -> Result<usize> {
    let candidates: Vec<usize> = (0..adapters.len())
        .filter(|&i| req.backends.contains(Backends::from(adapters[i].backend)))
        .filter(|&i| match &req.name_contains {
            Some(want) => adapters[i]
                .name
                .to_lowercase()
                .contains(&want.to_lowercase()),
            None => true,
        })
        .collect();
    if candidates.is_empty() {
        if let Some(wanted) = &req.name_contains {
            return Err(GpuError::AdapterNotFound {
                var: "WGPU_ADAPTER_NAME".into(),
                wanted: wanted.clone(),
                available: adapters.iter().map(AdapterSummary::describe).collect(),
            });
        }
        return Err(no_adapter(req));
    }
    let rank = |i: usize| {
        let a = &adapters[i];
        (
            type_rank(a.device_type, req.power),
            backend_rank(a.backend),
            i,
        )
    };
    Ok(candidates.into_iter().min_by_key(|&i| rank(i)).unwrap_or(0))
}

/// The adapter a lost device is re-created on: the one it was on, if it is still there (a
/// driver reset), else the one `req` picks among those left (an external GPU unplugged
/// leaves the integrated one).
pub fn choose_after_loss(
    adapters: &[AdapterSummary],
    lost_on: &AdapterSummary,
    req: &AdapterRequest,
) -> Result<usize> {
    let same = adapters
        .iter()
        .position(|a| a.name == lost_on.name && a.backend == lost_on.backend);
    match same {
        Some(i) => Ok(i),
        None => choose_adapter(adapters, req),
    }
}

pub(crate) fn no_adapter(req: &AdapterRequest) -> GpuError {
    GpuError::NoAdapter {
        backends: match &req.backends_source {
            Some(src) => src.clone(),
            None => format!("{:?}", req.backends),
        },
        hint: "; on Linux without a GPU install Mesa's software drivers \
               (Debian: apt-get install mesa-vulkan-drivers libegl-mesa0)"
            .to_string(),
    }
}

fn type_rank(t: DeviceType, power: PowerPreference) -> u8 {
    match (power, t) {
        (PowerPreference::LowPower, DeviceType::IntegratedGpu) => 0,
        (PowerPreference::LowPower, DeviceType::DiscreteGpu) => 1,
        (_, DeviceType::DiscreteGpu) => 0,
        (_, DeviceType::IntegratedGpu) => 1,
        (_, DeviceType::VirtualGpu) => 2,
        (_, DeviceType::Cpu) => 3,
        (_, DeviceType::Other) => 4,
    }
}

fn backend_rank(b: Backend) -> u8 {
    match b {
        Backend::Vulkan | Backend::Metal | Backend::Dx12 => 0,
        Backend::Gl => 1,
        _ => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn a(name: &str, backend: Backend, t: DeviceType) -> AdapterSummary {
        AdapterSummary {
            name: name.into(),
            backend,
            device_type: t,
        }
    }

    fn env(pairs: &[(&str, &str)]) -> AdapterRequest {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        AdapterRequest::from_lookup(|k| m.get(k).cloned()).unwrap()
    }

    fn machine() -> Vec<AdapterSummary> {
        vec![
            a("llvmpipe (LLVM 15)", Backend::Gl, DeviceType::Cpu),
            a(
                "Intel(R) UHD 770",
                Backend::Vulkan,
                DeviceType::IntegratedGpu,
            ),
            a(
                "NVIDIA GeForce RTX 4090",
                Backend::Vulkan,
                DeviceType::DiscreteGpu,
            ),
            a(
                "llvmpipe (LLVM 15, 256 bits)",
                Backend::Vulkan,
                DeviceType::Cpu,
            ),
        ]
    }

    #[test]
    fn high_performance_prefers_discrete_and_low_power_integrated() {
        assert_eq!(choose_adapter(&machine(), &env(&[])).unwrap(), 2);
        let low = env(&[("WGPU_POWER_PREF", "low")]);
        assert_eq!(choose_adapter(&machine(), &low).unwrap(), 1);
    }

    #[test]
    fn a_lost_device_comes_back_on_its_adapter_or_the_next_best() {
        let all = machine();
        let lost_on = all[1].clone(); // integrated, though discrete ranks first
        assert_eq!(choose_after_loss(&all, &lost_on, &env(&[])).unwrap(), 1);
        // The discrete GPU is gone (unplugged): the best of the rest.
        let rest = vec![all[0].clone(), all[1].clone(), all[3].clone()];
        assert_eq!(choose_after_loss(&rest, &all[2], &env(&[])).unwrap(), 1);
        // The same name on another backend is another adapter.
        let gl_only = vec![all[0].clone()];
        assert_eq!(choose_after_loss(&gl_only, &all[3], &env(&[])).unwrap(), 0);
        assert!(choose_after_loss(&[], &all[3], &env(&[])).is_err());
    }

    #[test]
    fn backend_filter_and_native_before_gl() {
        let gl = env(&[("PAGELLM_BACKEND", "gl")]);
        assert_eq!(choose_adapter(&machine(), &gl).unwrap(), 0);
        let cpu_only = vec![machine()[0].clone(), machine()[3].clone()];
        assert_eq!(choose_adapter(&cpu_only, &env(&[])).unwrap(), 1);
    }

    #[test]
    fn pagellm_backend_wins_over_wgpu_backend() {
        let r = env(&[("PAGELLM_BACKEND", "gl"), ("WGPU_BACKEND", "vulkan")]);
        assert_eq!(r.backends, Backends::GL);
        let r = env(&[("WGPU_BACKEND", "vulkan, dx12")]);
        assert_eq!(r.backends, Backends::VULKAN | Backends::DX12);
    }

    #[test]
    fn name_substring_is_case_insensitive() {
        let r = env(&[("WGPU_ADAPTER_NAME", "rtx")]);
        assert_eq!(choose_adapter(&machine(), &r).unwrap(), 2);
        let r = env(&[
            ("WGPU_ADAPTER_NAME", "LLVMPIPE"),
            ("PAGELLM_BACKEND", "vulkan"),
        ]);
        assert_eq!(choose_adapter(&machine(), &r).unwrap(), 3);
    }

    #[test]
    fn unmatched_name_lists_every_adapter() {
        let r = env(&[("WGPU_ADAPTER_NAME", "radeon")]);
        let msg = choose_adapter(&machine(), &r).unwrap_err().to_string();
        assert!(msg.contains("\"radeon\""), "{msg}");
        for ad in machine() {
            assert!(msg.contains(&ad.name), "{msg} lacks {}", ad.name);
        }
    }

    #[test]
    fn bad_backend_and_power_names_are_errors() {
        let e = AdapterRequest::from_lookup(|k| (k == "PAGELLM_BACKEND").then(|| "vulcan".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("vulcan") && e.contains("PAGELLM_BACKEND"), "{e}");
        let e = AdapterRequest::from_lookup(|k| (k == "WGPU_POWER_PREF").then(|| "max".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("max"), "{e}");
    }

    #[test]
    fn empty_machine_is_a_clear_error() {
        let e = choose_adapter(&[], &env(&[])).unwrap_err().to_string();
        assert!(e.contains("no GPU adapter"), "{e}");
    }
}
