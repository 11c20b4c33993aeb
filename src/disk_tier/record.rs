//! The byte format of one disk-tier record: a header naming what the block is (namespace,
//! key, parent key, token ids), the block's KV bytes, and a BLAKE3 hash of everything
//! before it. Pure functions; the I/O is in `mod.rs`. A record is accepted only if every
//! field equals what the reader expects and the hash matches, so a torn, truncated,
//! misnamed or bit-flipped file is a miss, never a wrong block.
//!
//! Layout (little-endian): magic `PLKVBLK\0`, format version u32, namespace [32], key [32],
//! parent flag u8 and parent key [32] (zeros without a parent), token count u32, tokens
//! u32 each, payload length u64, payload, BLAKE3 [32] of all preceding bytes.

use super::BlockKey;

pub(super) const MAGIC: &[u8; 8] = b"PLKVBLK\0";
pub(super) const VERSION: u32 = 1;
const HASH: usize = 32;

/// What a record must name to be accepted.
#[derive(Clone, Copy, Debug)]
pub(super) struct Expect<'a> {
    pub namespace: &'a [u8; 32],
    pub key: BlockKey,
    pub parent: Option<BlockKey>,
    pub tokens: &'a [u32],
    pub payload_len: usize,
}

/// Which check a record failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum RecordError {
    #[error("the record is shorter than its fields")]
    Truncated,
    #[error("the record has bytes past its end")]
    TrailingBytes,
    #[error("not a KV block record")]
    Magic,
    #[error("unknown record format version {0}")]
    Version(u32),
    #[error("the record belongs to another model or cache layout")]
    Namespace,
    #[error("the record is stored under another key")]
    Key,
    #[error("the record follows another block")]
    Parent,
    #[error("the record holds other tokens")]
    Tokens,
    #[error("the record's payload has another length")]
    PayloadLength,
    #[error("the record's checksum does not match its bytes")]
    Checksum,
}

/// The length of a record of `tokens` tokens and a `payload_len`-byte payload.
pub(super) fn encoded_len(tokens: usize, payload_len: usize) -> usize {
    8 + 4 + 32 + 32 + 33 + 4 + 4 * tokens + 8 + payload_len + HASH
}

/// The bytes of a record.
pub(super) fn encode(e: &Expect<'_>, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len(e.tokens.len(), payload.len()));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(e.namespace);
    out.extend_from_slice(&e.key.0);
    out.push(e.parent.is_some() as u8);
    out.extend_from_slice(&e.parent.map_or([0; 32], |p| p.0));
    out.extend_from_slice(&(e.tokens.len() as u32).to_le_bytes());
    for t in e.tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    let hash = blake3::hash(&out);
    out.extend_from_slice(hash.as_bytes());
    out
}

/// A cursor over a record's bytes that fails with `Truncated` past the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        let end = self.at.checked_add(n).ok_or(RecordError::Truncated)?;
        let s = self.bytes.get(self.at..end).ok_or(RecordError::Truncated)?;
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], RecordError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, RecordError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
}

/// The payload of `bytes` if it is a whole, intact record of exactly what `e` names.
pub(super) fn decode_verified<'b>(
    bytes: &'b [u8],
    e: &Expect<'_>,
) -> Result<&'b [u8], RecordError> {
    // The checksum first: it covers every field, so a field that disagrees below was
    // written so on purpose (another key's record under this name), not damaged.
    let body_len = bytes
        .len()
        .checked_sub(HASH)
        .ok_or(RecordError::Truncated)?;
    let (body, hash) = bytes.split_at(body_len);
    let mut r = Reader { bytes: body, at: 0 };
    if r.take(8)? != MAGIC {
        return Err(RecordError::Magic);
    }
    let version = r.u32()?;
    if version != VERSION {
        return Err(RecordError::Version(version));
    }
    if blake3::hash(body).as_bytes() != hash {
        return Err(RecordError::Checksum);
    }
    if &r.array::<32>()? != e.namespace {
        return Err(RecordError::Namespace);
    }
    if r.array::<32>()? != e.key.0 {
        return Err(RecordError::Key);
    }
    let flag = r.take(1)?[0];
    let parent = r.array::<32>()?;
    let stored = match flag {
        0 => None,
        1 => Some(BlockKey(parent)),
        _ => return Err(RecordError::Parent),
    };
    if stored != e.parent {
        return Err(RecordError::Parent);
    }
    let n = r.u32()? as usize;
    if n != e.tokens.len() {
        return Err(RecordError::Tokens);
    }
    for &t in e.tokens {
        if r.u32()? != t {
            return Err(RecordError::Tokens);
        }
    }
    let len = u64::from_le_bytes(r.array()?);
    if len != e.payload_len as u64 {
        return Err(RecordError::PayloadLength);
    }
    let payload = r.take(e.payload_len)?;
    if r.at != body.len() {
        return Err(RecordError::TrailingBytes);
    }
    Ok(payload)
}
