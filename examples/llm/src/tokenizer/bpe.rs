//! Byte-level BPE: GPT-2's byte-to-character table and the merge loop over one word.
//!
//! A word starts as one symbol per unit (a byte of the raw word for byte-level vocabularies, a
//! UTF-8 character for SentencePiece-style BPE such as Gemma 4); the adjacent pair with the lowest
//! merge rank (leftmost on ties) merges until no pair has a rank. Symbols carry the id of their
//! text in the tokenizer's string table, so no string is built or hashed inside the loop.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// GPT-2's reversible map from bytes to printable characters: printable Latin-1 bytes map to
/// themselves, the others to U+0100 onwards in byte order.
pub(crate) const BYTE_TO_CHAR: [char; 256] = byte_to_char_table();

/// The inverse of [`BYTE_TO_CHAR`], indexed by code point (all below U+0144).
const CHAR_TO_BYTE: [Option<u8>; 0x144] = {
    let mut inv = [None; 0x144];
    let mut b = 0;
    while b < 256 {
        inv[BYTE_TO_CHAR[b] as usize] = Some(b as u8);
        b += 1;
    }
    inv
};

/// The byte GPT-2's alphabet maps to `c`, if `c` is in it.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    CHAR_TO_BYTE.get(c as usize).copied().flatten()
}

const fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 0x100u32;
    let mut b = 0;
    while b < 256 {
        let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let cp = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        // Every value is below U+0144, a valid scalar value.
        table[b] = match char::from_u32(cp) {
            Some(c) => c,
            None => '\u{FFFD}',
        };
        b += 1;
    }
    table
}

/// One symbol of the word being merged: a byte range of the word, linked to its neighbours.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Symbol {
    pub start: u32,
    pub len: u32,
    /// Id of the symbol's text in the string table (`None`: the text is in no token or merge).
    pub sid: Option<u32>,
    prev: i32,
    next: i32,
}

/// A candidate merge: (rank, left index) orders it, `size` tells whether it went stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Bigram {
    rank: u32,
    left: u32,
    right: u32,
    size: u32,
    merged: u32,
}

/// Reusable buffers of the merge loop.
#[derive(Debug, Default)]
pub(crate) struct Merger {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Reverse<Bigram>>,
}

impl Merger {
    /// Merges one word. `units` gives each initial symbol as (byte length, string id);
    /// `rank_of(left, right)` returns the pair's (rank, merged string id). Returns the final
    /// symbols in order.
    pub(crate) fn merge(
        &mut self,
        units: impl Iterator<Item = (u32, Option<u32>)>,
        rank_of: impl Fn(u32, u32) -> Option<(u32, u32)>,
    ) -> impl Iterator<Item = &Symbol> {
        self.symbols.clear();
        self.queue.clear();
        let mut offset = 0u32;
        for (len, sid) in units {
            let i = self.symbols.len() as i32;
            self.symbols.push(Symbol {
                start: offset,
                len,
                sid,
                prev: i - 1,
                next: i + 1,
            });
            offset += len;
        }
        if let Some(last) = self.symbols.last_mut() {
            last.next = -1;
        }
        for i in 1..self.symbols.len() {
            self.push_pair(i as i32 - 1, i as i32, &rank_of);
        }
        while let Some(Reverse(b)) = self.queue.pop() {
            let (l, r) = (b.left as usize, b.right as usize);
            let (left, right) = (self.symbols[l], self.symbols[r]);
            // Stale: one side was merged away or the right side grew since the pair was queued
            // (the left side cannot grow without its right neighbour disappearing).
            if left.len == 0 || right.len == 0 || left.len + right.len != b.size {
                continue;
            }
            let sym = &mut self.symbols[l];
            sym.len += right.len;
            sym.sid = Some(b.merged);
            sym.next = right.next;
            self.symbols[r].len = 0;
            if right.next >= 0 {
                self.symbols[right.next as usize].prev = l as i32;
            }
            let (prev, next) = (self.symbols[l].prev, self.symbols[l].next);
            self.push_pair(prev, l as i32, &rank_of);
            self.push_pair(l as i32, next, &rank_of);
        }
        self.symbols.iter().filter(|s| s.len > 0)
    }

    fn push_pair(
        &mut self,
        left: i32,
        right: i32,
        rank_of: &impl Fn(u32, u32) -> Option<(u32, u32)>,
    ) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (self.symbols[left as usize], self.symbols[right as usize]);
        let (Some(ls), Some(rs)) = (l.sid, r.sid) else {
            return;
        };
        if let Some((rank, merged)) = rank_of(ls, rs) {
            self.queue.push(Reverse(Bigram {
                rank,
                left: left as u32,
                right: right as u32,
                size: l.len + r.len,
                merged,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        let t = BYTE_TO_CHAR;
        assert_eq!(t[b'!' as usize], '!');
        assert_eq!(t[b' ' as usize], 'Ġ'); // U+0120
        assert_eq!(t[b'\n' as usize], 'Ċ'); // U+010A
        assert_eq!(t[0], 'Ā'); // U+0100
        assert_eq!(t[0xAD], 'Ń'); // U+0143, the last one
        let mut seen = std::collections::HashSet::new();
        assert!(t.iter().all(|c| seen.insert(*c)), "table is not one-to-one");
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(t[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte('a'), Some(b'a'));
        assert_eq!(char_to_byte(' '), None);
        assert_eq!(char_to_byte('\u{144}'), None);
    }
}
