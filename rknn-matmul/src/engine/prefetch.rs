//! Address ranges a lane's forward reads first, and asking the CPU to fetch them ahead.
//!
//! Why: in decode every linear's own state (its shard, the context and memory wrappers, the
//! tensor attributes, the channel scales) has left the caches by its next forward, a token
//! later, because each token streams the model's weights through them. A worker reads its
//! next linear's state while idle ([`super::warm`]); the calling thread's lane is never idle,
//! so it started each forward with a chain of misses and was the slower lane of most rounds.
//! Each lane now remembers, per shard, what the shard it ran next read first, and at the end of
//! a forward hands those ranges to the CPU's prefetch instruction, while the caller does its
//! host work before the next linear.
//!
//! The ranges are addresses only: a prefetch never faults and reads nothing architecturally,
//! so a stale range (its shard was dropped or moved since) costs a useless fetch and nothing
//! else. They are never dereferenced.

/// At most this many ranges per shard.
const RANGES: usize = 16;

/// Bytes per range at most (longer ones are cut: the hardware prefetchers follow a sequential
/// read once it has begun).
const MAX_BYTES: usize = 512;

/// Address ranges to prefetch, fixed capacity (no allocation on the forward path).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ranges {
    at: [(usize, u16); RANGES],
    len: u8,
}

impl Ranges {
    /// Adds the bytes of `value` (or the first [`MAX_BYTES`]); ignored when full.
    pub(crate) fn add<T: ?Sized>(&mut self, value: &T) {
        let bytes = std::mem::size_of_val(value).min(MAX_BYTES);
        self.add_raw(std::ptr::from_ref(value).cast::<u8>().addr(), bytes);
    }

    /// Adds the first bytes of `items`' storage.
    pub(crate) fn add_slice<T>(&mut self, items: &[T]) {
        if !items.is_empty() {
            self.add(items);
        }
    }

    fn add_raw(&mut self, at: usize, bytes: usize) {
        if let Some(slot) = self.at.get_mut(usize::from(self.len)) {
            // MAX_BYTES fits u16.
            *slot = (at, bytes as u16);
            self.len += 1;
        }
    }

    /// The ranges added.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.at[..usize::from(self.len)]
            .iter()
            .map(|&(at, bytes)| (at, usize::from(bytes)))
    }

    /// Asks the CPU to bring every range into its caches. Never faults.
    pub(crate) fn prefetch(&self) {
        for (at, bytes) in self.iter() {
            for line in (at & !63..at.saturating_add(bytes)).step_by(64) {
                prefetch_line(line);
            }
        }
    }
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
fn prefetch_line(at: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // SAFETY: PREFETCHT0 is a hint: it reads nothing architecturally and never faults, whatever
    // the address (Intel SDM vol. 2, PREFETCHh). The pointer is never dereferenced.
    #[allow(unused_unsafe)]
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::without_provenance::<i8>(at))
    };
}

#[cfg(all(target_arch = "aarch64", not(miri)))]
fn prefetch_line(at: usize) {
    // SAFETY: PRFM is a hint: it never faults and changes no architectural state (Arm ARM
    // C6.2, PRFM); the address is not dereferenced.
    unsafe {
        std::arch::asm!("prfm pldl1keep, [{}]", in(reg) at, options(nostack, preserves_flags, readonly))
    };
}

#[cfg(any(not(any(target_arch = "x86_64", target_arch = "aarch64")), miri))]
fn prefetch_line(_at: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_the_values_bytes_cut_and_capped() {
        let small = [1u8, 2, 3];
        let big = vec![0u64; 1000];
        let mut r = Ranges::default();
        r.add(&small);
        r.add_slice(&big);
        r.add_slice::<u32>(&[]);
        let got: Vec<_> = r.iter().collect();
        assert_eq!(
            got,
            [(small.as_ptr().addr(), 3), (big.as_ptr().addr(), MAX_BYTES)]
        );
        for _ in 0..2 * RANGES {
            r.add(&small);
        }
        assert_eq!(r.iter().count(), RANGES, "full: later ranges are dropped");
        // Prefetching any address is harmless, a dangling one or the top of the address space
        // included.
        Ranges {
            at: [(usize::MAX - 10, 64); RANGES],
            len: RANGES as u8,
        }
        .prefetch();
        r.prefetch();
    }
}
