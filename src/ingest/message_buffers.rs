//! The buffers received IPC messages are copied into ([`super::decode::BodyDecoder`]), reused
//! rather than freed. A message's record batch is forwarded to Storage Write as it arrived, so
//! its bytes live until the batch is uploaded: at K=64 they are nearly all of a replica's heap
//! (both budgets' worth), several MiB each, allocated on one thread and freed on another. Freed
//! at that rate they leave the allocator holding tens of MiB of pages beyond what is live
//! (docs/performance.md); kept here, the same buffers serve the next messages. A buffer coming
//! back is kept idle only while lent and idle together stay within `limit_bytes` (the
//! pipeline's: 1.25 times the two budgets that count the lent ones), otherwise freed; lending is
//! never refused (the budgets bound what is received).
//!
//! A buffer is leased as soon as a message's length is known and its bytes are copied in as
//! they arrive, so the connection's read buffer is free for the next read at once (rather than
//! pinned, slice by slice, until the message is complete). Frozen, it is the owner of a
//! [`Bytes`] ([`Bytes::from_owner`]): when the last view of the message (the decoded arrays,
//! the forwarded request) is dropped, the buffer comes back. Next: the decoded batch goes to
//! `ingest::prepare` and on to a lane.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::telemetry;

/// Messages smaller than this are joined into plain allocations: the allocator's own caches
/// serve them well, and pooling them would spend the pool on many small buffers.
const SMALLEST_POOLED_BYTES: usize = 256 * 1024;

/// A bounded pool of message buffers, by capacity class.
#[derive(Debug)]
pub struct MessageBuffers {
    limit_bytes: usize,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    /// Idle buffers by capacity (a [`capacity_class`]).
    idle: BTreeMap<usize, Vec<Vec<u8>>>,
    idle_bytes: usize,
    /// Capacity of the buffers lent out and not yet back.
    lent_bytes: usize,
}

impl MessageBuffers {
    /// A pool holding at most `limit_bytes` of buffers, lent and idle together (beyond it, a
    /// buffer given back is freed, and idle ones are freed to make room for a new class).
    pub fn new(limit_bytes: usize) -> Arc<Self> {
        Arc::new(Self { limit_bytes, state: Mutex::new(PoolState::default()) })
    }

    /// A pool that keeps nothing: every message is joined into a fresh allocation.
    pub fn unpooled() -> Arc<Self> {
        Self::new(0)
    }

    /// The pieces of one message as one buffer: the piece itself when there is one (no copy),
    /// otherwise a copy into a pooled buffer (or a plain one, for small messages).
    pub fn join(self: &Arc<Self>, mut pieces: Vec<Bytes>) -> Bytes {
        if pieces.len() == 1 {
            return pieces.pop().unwrap_or_default();
        }
        let length_bytes = pieces.iter().map(Bytes::len).sum();
        let Some(mut buffer) = self.lease(length_bytes) else {
            // Received already, so this much memory was there a moment ago.
            let mut joined = Vec::with_capacity(length_bytes);
            pieces.iter().for_each(|piece| joined.extend_from_slice(piece));
            return Bytes::from(joined);
        };
        for piece in &pieces {
            buffer.extend(piece);
        }
        buffer.freeze()
    }

    /// An empty buffer for a message of `length_bytes`, filled by the caller as its bytes
    /// arrive: pooled when the message is large enough, a plain allocation otherwise. `None`
    /// when no memory can be reserved for it (the caller keeps the pieces instead). The
    /// caller counts its room in the receive budget ([`super::decode::BodyDecoder::bytes_to_hold`]).
    pub(crate) fn lease(self: &Arc<Self>, length_bytes: usize) -> Option<MessageBuffer> {
        if length_bytes < SMALLEST_POOLED_BYTES || self.limit_bytes == 0 {
            let mut buffer = Vec::new();
            buffer.try_reserve_exact(length_bytes).ok()?;
            return Some(MessageBuffer { buffer, pool: None });
        }
        Some(MessageBuffer { buffer: self.take(length_bytes)?, pool: Some(Arc::clone(self)) })
    }

    /// An empty buffer with room for `length_bytes`: an idle one of its class, or a new one.
    fn take(&self, length_bytes: usize) -> Option<Vec<u8>> {
        let class = capacity_class(length_bytes);
        let mut state = self.state.lock();
        let reused = match state.idle.entry(class) {
            Entry::Occupied(mut idle) => {
                let buffer = idle.get_mut().pop();
                if idle.get().is_empty() {
                    idle.remove();
                }
                buffer
            }
            Entry::Vacant(_) => None,
        };
        let buffer = match reused {
            Some(buffer) => {
                state.idle_bytes -= class;
                buffer
            }
            None => {
                state.free_idle_until(self.limit_bytes.saturating_sub(class));
                let mut buffer = Vec::new();
                buffer.try_reserve_exact(class).ok()?;
                buffer
            }
        };
        state.lent_bytes += buffer.capacity();
        telemetry::message_buffers(state.lent_bytes, state.idle_bytes);
        Some(buffer)
    }

    /// A lent buffer back: kept idle while the pool stays within its limit, freed otherwise.
    fn give_back(&self, mut buffer: Vec<u8>) {
        let capacity = buffer.capacity();
        let mut state = self.state.lock();
        state.lent_bytes = state.lent_bytes.saturating_sub(capacity);
        if state.lent_bytes + state.idle_bytes + capacity <= self.limit_bytes {
            buffer.clear();
            state.idle.entry(capacity).or_default().push(buffer);
            state.idle_bytes += capacity;
        }
        telemetry::message_buffers(state.lent_bytes, state.idle_bytes);
    }

    /// Capacity lent out and idle (for tests).
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> (usize, usize) {
        let state = self.state.lock();
        (state.lent_bytes, state.idle_bytes)
    }
}

impl PoolState {
    /// Frees idle buffers, largest class first, until lent and idle together are at most
    /// `total_bytes` (or nothing is idle).
    fn free_idle_until(&mut self, total_bytes: usize) {
        while self.lent_bytes + self.idle_bytes > total_bytes {
            let Some(mut largest) = self.idle.last_entry() else { return };
            let freed = largest.get_mut().pop();
            if largest.get().is_empty() {
                largest.remove();
            }
            self.idle_bytes -= freed.map_or(0, |buffer| buffer.capacity());
        }
    }
}

/// A message's buffer while its bytes arrive, then (frozen) the owner of the [`Bytes`] its
/// views share: a pooled one goes back to its pool when the last view is dropped.
#[derive(Debug)]
pub(crate) struct MessageBuffer {
    buffer: Vec<u8>,
    pool: Option<Arc<MessageBuffers>>,
}

impl MessageBuffer {
    /// Appends bytes of the message (within the length it was leased for, or it grows).
    pub(crate) fn extend(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// Capacity not yet filled with the message's bytes.
    pub(crate) fn unfilled_bytes(&self) -> usize {
        self.buffer.capacity() - self.buffer.len()
    }

    /// The message's bytes, shared.
    pub(crate) fn freeze(mut self) -> Bytes {
        if self.pool.is_none() {
            return Bytes::from(std::mem::take(&mut self.buffer));
        }
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for MessageBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for MessageBuffer {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give_back(std::mem::take(&mut self.buffer));
        }
    }
}

/// The capacity a buffer of `length_bytes` is taken with: the next of four classes per
/// doubling (the allocator's own large size classes, so the class is what it allocates
/// anyway), which lets messages of near sizes share buffers.
fn capacity_class(length_bytes: usize) -> usize {
    let step = (length_bytes.next_power_of_two() / 8).max(4096);
    length_bytes.div_ceil(step) * step
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(length_bytes: usize) -> Vec<Bytes> {
        let half = length_bytes / 2;
        vec![Bytes::from(vec![1u8; half]), Bytes::from(vec![2u8; length_bytes - half])]
    }

    #[test]
    fn classes_are_four_per_doubling() {
        const MIB: usize = 1 << 20;
        assert_eq!(capacity_class(5 * MIB + 1), 6 * MIB);
        assert_eq!(capacity_class(6 * MIB), 6 * MIB);
        assert_eq!(capacity_class(3 * MIB - 7), 3 * MIB);
        assert_eq!(capacity_class(8 * MIB + 1), 10 * MIB);
    }

    #[test]
    fn a_joined_message_holds_its_pieces_in_order() {
        let pool = MessageBuffers::new(16 << 20);
        let joined = pool.join(pieces(1 << 20));
        assert_eq!(joined.len(), 1 << 20);
        assert_eq!((joined[0], joined[(1 << 19) - 1], joined[1 << 19], joined[(1 << 20) - 1]), (1, 1, 2, 2));
    }

    #[test]
    fn a_buffer_comes_back_when_its_last_view_is_dropped_and_serves_the_next_message() {
        let pool = MessageBuffers::new(16 << 20);
        let joined = pool.join(pieces(1 << 20));
        let view = joined.slice(10..20);
        drop(joined);
        assert_eq!(pool.held_bytes(), (1 << 20, 0), "a view still holds it");
        let address = view.as_ptr() as usize - 10;
        drop(view);
        assert_eq!(pool.held_bytes(), (0, 1 << 20));
        let next = pool.join(pieces((1 << 20) - 100));
        assert_eq!(next.as_ptr() as usize, address, "the idle buffer of its class is reused");
        assert_eq!(pool.held_bytes(), (1 << 20, 0));
    }

    #[test]
    fn the_pool_never_keeps_more_than_its_limit() {
        let pool = MessageBuffers::new(3 << 20);
        let lent: Vec<Bytes> = (0..5).map(|_| pool.join(pieces(1 << 20))).collect();
        assert_eq!(pool.held_bytes(), (5 << 20, 0), "lending is never refused: the budgets bound it");
        drop(lent);
        assert_eq!(pool.held_bytes(), (0, 3 << 20), "what comes back beyond the limit is freed");
        let larger = pool.join(pieces(2 << 20));
        assert_eq!(pool.held_bytes(), (2 << 20, 1 << 20), "idle buffers make room for a new class");
        drop(larger);
    }

    #[test]
    fn a_class_whose_last_idle_buffer_was_reused_is_not_counted_again() {
        const MIB: usize = 1 << 20;
        let pool = MessageBuffers::new(4 * MIB);
        drop((pool.join(pieces(MIB)), pool.join(pieces(2 * MIB))));
        assert_eq!(pool.held_bytes(), (0, 3 * MIB));
        let reused = pool.join(pieces(2 * MIB));
        assert_eq!(pool.held_bytes(), (2 * MIB, MIB));
        let larger = pool.join(pieces(2 * MIB + MIB / 2));
        assert_eq!(pool.held_bytes(), (4 * MIB + MIB / 2, 0), "the 1 MiB idle buffer made room");
        drop((reused, larger));
        assert_eq!(pool.held_bytes(), (0, 2 * MIB + MIB / 2), "kept up to the limit");
    }

    #[test]
    fn small_messages_and_an_unpooled_decoder_use_plain_allocations() {
        let pool = MessageBuffers::new(16 << 20);
        drop(pool.join(pieces(64 * 1024)));
        assert_eq!(pool.held_bytes(), (0, 0));
        let unpooled = MessageBuffers::unpooled();
        drop(unpooled.join(pieces(1 << 20)));
        assert_eq!(unpooled.held_bytes(), (0, 0));
    }
}
