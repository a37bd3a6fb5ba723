//! Which special tokens occur in a text, in one pass: a byte trie of their texts.
//!
//! Special-token partitioning (llama.cpp's `tokenizer_st_partition`) searches the text for
//! every special token in turn, longest first. Most vocabularies have a few dozen, but Gemma 3
//! has 6 414 (6 242 of them `<unusedN>`), and searching for each one was most of the time of
//! encoding. The partitioning itself is unchanged; the trie only tells it which tokens occur
//! in the text at all, so it skips the others without a search. A token absent from the whole
//! text is absent from every fragment of it, so the result is the same.

/// No node.
const NONE: u32 = u32::MAX;

#[derive(Debug, Default)]
struct Node {
    /// (byte, child node), in insertion order (most nodes have one child).
    next: Vec<(u8, u32)>,
    /// The token ending here: its index in the list the trie was built from.
    index: Option<u32>,
}

/// A byte trie of token texts.
#[derive(Debug)]
pub(super) struct TokenTrie {
    /// The child of the root for each first byte (a table: most bytes start no token).
    root: Box<[u32; 256]>,
    nodes: Vec<Node>,
}

impl TokenTrie {
    /// The trie of `texts`; [`occurring`](Self::occurring) reports a text's index in this list.
    pub(super) fn new<'a>(texts: impl IntoIterator<Item = &'a str>) -> Self {
        let mut trie = Self {
            root: Box::new([NONE; 256]),
            nodes: Vec::new(),
        };
        for (index, text) in texts.into_iter().enumerate() {
            let Some((&first, rest)) = text.as_bytes().split_first() else {
                continue;
            };
            let mut node = trie.root[first as usize];
            if node == NONE {
                node = trie.push();
                trie.root[first as usize] = node;
            }
            for &b in rest {
                node = match trie.child(node, b) {
                    Some(child) => child,
                    None => {
                        let child = trie.push();
                        trie.nodes[node as usize].next.push((b, child));
                        child
                    }
                };
            }
            // Texts are distinct (the vocabulary checks); keep the first if not.
            let slot = &mut trie.nodes[node as usize].index;
            slot.get_or_insert(index as u32);
        }
        trie
    }

    fn push(&mut self) -> u32 {
        self.nodes.push(Node::default());
        (self.nodes.len() - 1) as u32
    }

    fn child(&self, node: u32, b: u8) -> Option<u32> {
        self.nodes[node as usize]
            .next
            .iter()
            .find(|&&(c, _)| c == b)
            .map(|&(_, child)| child)
    }

    /// The indices of the texts that occur somewhere in `text`, ascending, each once.
    pub(super) fn occurring(&self, text: &[u8]) -> Vec<u32> {
        let mut found = Vec::new();
        for (i, &first) in text.iter().enumerate() {
            let mut node = self.root[first as usize];
            if node == NONE {
                continue;
            }
            let mut rest = text[i + 1..].iter();
            loop {
                if let Some(index) = self.nodes[node as usize].index {
                    found.push(index);
                }
                match rest.next().and_then(|&b| self.child(node, b)) {
                    Some(child) => node = child,
                    None => break,
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        found
    }
}

#[cfg(test)]
mod tests {
    use super::TokenTrie;

    #[test]
    fn finds_every_occurring_text_once() {
        let trie = TokenTrie::new(["<b>", "<", "</b>", "ab", "abc", "", "é"]);
        assert_eq!(trie.occurring(b"x<b>y</b>z<b>"), vec![0, 1, 2]);
        assert_eq!(trie.occurring(b"abcab"), vec![3, 4]);
        assert_eq!(trie.occurring(b"ab"), vec![3]);
        assert_eq!(trie.occurring("caf\u{e9}".as_bytes()), vec![6]);
        assert_eq!(trie.occurring(b""), Vec::<u32>::new());
        assert_eq!(trie.occurring(b"</"), vec![1]);
    }

    /// The same answer as searching for each text.
    #[test]
    fn agrees_with_contains() {
        let texts = [
            "  ",
            "   ",
            "\n",
            "\n\n",
            "<unused1>",
            "<unused12>",
            "<u>",
            "<ul>",
        ];
        let trie = TokenTrie::new(texts);
        let mut rng = fastrand::Rng::with_seed(3);
        let alphabet = [
            " ", "\n", "<", "u", "n", "s", "e", "d", "1", "2", ">", "l", "x",
        ];
        for _ in 0..2000 {
            let text: String = (0..rng.usize(0..30))
                .map(|_| alphabet[rng.usize(0..alphabet.len())])
                .collect();
            let want: Vec<u32> = (0..texts.len() as u32)
                .filter(|&i| text.contains(texts[i as usize]))
                .collect();
            assert_eq!(trie.occurring(text.as_bytes()), want, "{text:?}");
        }
    }
}
