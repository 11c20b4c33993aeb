//! Fault injection: a switch that destroys the GPU device at chosen moments, so that users
//! and tests can watch the engine recover from a lost device (a driver reset, a GPU
//! timeout, an unplugged external GPU) on any machine, software adapters included.
//!
//! `PAGELLM_INJECT_DEVICE_LOSS=STEP[,STEP...]`, read when an engine opens (the CLI, the
//! server, the bindings and the library alike), destroys the device right after engine
//! step `STEP` (counted from 1, every step begun) has submitted its work, so that the
//! step's wait meets a lost device. Two more items: `load` destroys the device halfway
//! through the first upload of the weights, `reload` halfway through the upload of the
//! first recovery. [`crate::EngineConfig::inject_device_loss`] sets the same from code.

/// The environment variable [`DeviceLossInjection::from_env`] reads.
pub const DEVICE_LOSS_VAR: &str = "PAGELLM_INJECT_DEVICE_LOSS";

/// When to destroy the device (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceLossInjection {
    /// Engine steps (from 1, every step begun) after whose submit the device is destroyed.
    pub steps: Vec<u64>,
    /// Destroy the device halfway through the first weight upload.
    pub load: bool,
    /// Destroy the new device halfway through the first recovery's weight upload.
    pub reload: bool,
}

impl DeviceLossInjection {
    /// Parses `STEP[,STEP...]`, with `load` and `reload` among the items; the error names
    /// the item that is neither.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut out = DeviceLossInjection::default();
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item {
                "load" => out.load = true,
                "reload" => out.reload = true,
                _ => match item.parse::<u64>() {
                    Ok(step) if step > 0 => out.steps.push(step),
                    _ => {
                        return Err(format!(
                            "{DEVICE_LOSS_VAR}: {item:?} is not a step number (1 or more), \
                             `load` or `reload`"
                        ))
                    }
                },
            }
        }
        out.steps.sort_unstable();
        out.steps.dedup();
        Ok(out)
    }

    /// What `PAGELLM_INJECT_DEVICE_LOSS` asks for (nothing when it is unset or empty).
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(DEVICE_LOSS_VAR) {
            Ok(v) => Self::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(e) => Err(format!("{DEVICE_LOSS_VAR}: {e}")),
        }
    }

    /// Whether nothing is injected.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty() && !self.load && !self.reload
    }

    /// Whether the device is destroyed at engine step `step`.
    pub fn at_step(&self, step: u64) -> bool {
        self.steps.binary_search(&step).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_steps_and_phases_and_names_a_bad_item() {
        let i = DeviceLossInjection::parse(" 7,3, load,3 ,reload").unwrap();
        assert_eq!(i.steps, vec![3, 7]);
        assert!(i.load && i.reload);
        assert!(i.at_step(3) && i.at_step(7) && !i.at_step(4));
        assert!(DeviceLossInjection::parse("").unwrap().is_empty());
        for bad in ["0", "x", "-1", "3;4"] {
            let e = DeviceLossInjection::parse(bad).unwrap_err();
            assert!(e.contains(DEVICE_LOSS_VAR), "{e}");
        }
    }
}
