//! What pins hold, as plain data the block manager keeps: per pin its blocks, per block how
//! many pins hold it (the operations are in `pins.rs`).

use super::ids::DeviceBlockId;

/// A pinned prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PinId(pub u64);

/// The pins' holds: per pin its blocks, per block how many pins hold it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pins {
    pub(super) held: std::collections::BTreeMap<PinId, Vec<DeviceBlockId>>,
    pub(super) counts: std::collections::BTreeMap<DeviceBlockId, u32>,
    pub(super) next: u64,
}
