//! Errors of the block manager. A failing operation leaves the manager exactly as it was,
//! so the caller (the scheduler) can react, by preempting, recomputing or rejecting a
//! request, and carry on.

use super::ids::{DeviceBlockId, SeqId};

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    #[error("invalid KV cache configuration: {0}")]
    InvalidConfig(String),

    #[error("{0} is not known to the block manager")]
    UnknownSequence(SeqId),

    #[error("{0} already has a block table")]
    SequenceExists(SeqId),

    #[error("{0}: a block manager with several KV cache groups takes ids below 2^56")]
    SequenceIdTooLarge(SeqId),

    #[error("{0} is named more than once in one request")]
    DuplicateSequence(SeqId),

    #[error("a sequence group must name at least one sequence")]
    EmptyGroup,

    #[error("a prompt must hold at least one token")]
    EmptyPrompt,

    #[error("out of device KV blocks: {needed} needed, {available} usable")]
    OutOfBlocks { needed: usize, available: usize },

    #[error(
        "{needed} device blocks needed, but at most {capacity} (the pool less its watermark) \
         can ever be given to one sequence group"
    )]
    ExceedsCapacity { needed: usize, capacity: usize },

    #[error("host swap pool full: {needed} host blocks needed, {free} free")]
    HostPoolFull { needed: usize, free: usize },

    #[error("{0} is swapped out to host memory")]
    Swapped(SeqId),

    #[error("{0} is on the device, not swapped out")]
    NotSwapped(SeqId),

    #[error(
        "{0} holds blocks that this step's pending plan writes; swap it out after the plan \
         is taken, or recompute it"
    )]
    BlocksInFlight(SeqId),

    #[error(
        "{seq} cannot give back part of {block}, which other sequences share; only slots in \
         blocks of its own or whole shared blocks can be given back"
    )]
    CutsSharedBlock { seq: SeqId, block: DeviceBlockId },

    #[error("request {0} is not held by the scheduler")]
    UnknownGroup(u64),

    #[error("a step's sampling results do not fit request {request}: {reason}")]
    BadSample { request: u64, reason: String },

    #[error("{seq} has {num_tokens} slots, but only {given} of its tokens were passed")]
    MissingTokens {
        seq: SeqId,
        given: usize,
        num_tokens: usize,
    },

    #[error("the tokens passed for {0} are not the ones its named blocks hold")]
    TokensMismatch(SeqId),

    #[error("{seq} has {num_tokens} tokens, so {value} is out of range")]
    TokenOutOfRange {
        seq: SeqId,
        value: usize,
        num_tokens: usize,
    },

    #[error("no full block of this prefix is cached on the device; run it first, then pin it")]
    NothingToPin,

    #[error(
        "pinning {pinned} blocks would leave {left} of the pool for requests; at most half the \
         pool (less its watermark) may be pinned"
    )]
    PinTooLarge { pinned: usize, left: usize },

    #[error("pin {0} is not held")]
    UnknownPin(u64),

    #[error(
        "{0} is still in use, so the device pool cannot shrink below it (pinned prefix blocks \
         stay where they are: unpin them first)"
    )]
    BlockInUse(DeviceBlockId),
}
