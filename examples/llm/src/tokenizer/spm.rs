//! SentencePiece-style merging (llama.cpp's SPM tokenizer): start from single characters and
//! keep merging the adjacent pair whose concatenation is the vocabulary token with the highest
//! score (leftmost on ties).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: isize,
    next: isize,
}

#[derive(Debug, Clone, Copy)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// The heap pops the greatest: highest score first, then the leftmost pair. Scores compare
    /// as C++'s `<` does (so -0.0 ties with 0.0, and a NaN ties with everything).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Splits `text` (already space-escaped) into final pieces, returned as byte ranges of `text`.
/// `score_of(piece)` returns the score of the token spelled `piece`, if there is one.
pub(crate) fn segment(text: &str, score_of: impl Fn(&str) -> Option<f32>) -> Vec<(usize, usize)> {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    let n_chars = text.chars().count();
    for (i, (start, c)) in text.char_indices().enumerate() {
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: i as isize - 1,
            next: if i + 1 == n_chars { -1 } else { i as isize + 1 },
        });
    }
    let mut queue = BinaryHeap::new();
    let try_add =
        |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: isize, right: isize| {
            if left < 0 || right < 0 {
                return;
            }
            let (l, r) = (symbols[left as usize], symbols[right as usize]);
            let piece = &text[l.start..r.start + r.len];
            if let Some(score) = score_of(piece) {
                queue.push(Bigram {
                    score,
                    left: left as usize,
                    right: right as usize,
                    size: piece.len(),
                });
            }
        };
    for i in 1..symbols.len() {
        try_add(&mut queue, &symbols, i as isize - 1, i as isize);
    }
    while let Some(b) = queue.pop() {
        let (left, right) = (symbols[b.left], symbols[b.right]);
        if left.len == 0 || right.len == 0 || left.len + right.len != b.size {
            continue;
        }
        symbols[b.left].len += right.len;
        symbols[b.left].next = right.next;
        symbols[b.right].len = 0;
        if right.next >= 0 {
            symbols[right.next as usize].prev = b.left as isize;
        }
        try_add(&mut queue, &symbols, left.prev, b.left as isize);
        try_add(&mut queue, &symbols, b.left as isize, right.next);
    }
    symbols
        .iter()
        .filter(|s| s.len > 0)
        .map(|s| (s.start, s.start + s.len))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_by_score_then_leftmost() {
        // "ab" beats "bc" by score although both are possible; then "abc" is not a token.
        let vocab = |s: &str| match s {
            "ab" => Some(-1.0),
            "bc" => Some(-2.0),
            "aa" => Some(-5.0),
            _ => None,
        };
        assert_eq!(segment("abc", vocab), vec![(0, 2), (2, 3)]);
        // Equal scores: the leftmost pair merges first.
        assert_eq!(segment("aaa", vocab), vec![(0, 2), (2, 3)]);
        assert_eq!(segment("", vocab), vec![]);
        // Multi-byte characters stay whole.
        assert_eq!(segment("é▁", |_| None), vec![(0, 2), (2, 5)]);
        // -0.0 and 0.0 tie, so the leftmost pair wins.
        let signed = |s: &str| match s {
            "ab" => Some(-0.0),
            "bc" => Some(0.0),
            _ => None,
        };
        assert_eq!(segment("abc", signed), vec![(0, 2), (2, 3)]);
        // NaN scores do not panic.
        assert_eq!(segment("abcd", |_| Some(f32::NAN)).len(), 1);
    }
}
