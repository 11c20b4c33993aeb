//! Typed identifiers: a physical block on the device, a physical block in the host swap
//! pool, and a sequence. Device and host ids are distinct types so that a swap plan cannot
//! put a host block where a device block belongs, or the other way round.

use std::fmt;
use std::hash::Hash;

/// What the generic allocator needs from a block id: a dense index into its pool.
pub(crate) trait BlockId: Copy + Eq + Ord + Hash + fmt::Debug + fmt::Display {
    fn from_index(index: u32) -> Self;
    fn index(self) -> usize;
}

macro_rules! block_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u32);

        impl BlockId for $name {
            fn from_index(index: u32) -> Self {
                Self(index)
            }
            fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

block_id!(
    /// A physical KV block in the device pool (`0..num_device_blocks`): the index the GPU
    /// kernels take, so a token's slot is `block.0 * block_size + offset`.
    DeviceBlockId,
    "d"
);

block_id!(
    /// A physical KV block in the host swap pool (`0..num_host_blocks`), of the same byte
    /// size as a device block.
    HostBlockId,
    "h"
);

/// A sequence: one prompt and its continuation. The samples of one request or the beams
/// of one beam search are several sequences that share blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqId(pub u64);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sequence {}", self.0)
    }
}
