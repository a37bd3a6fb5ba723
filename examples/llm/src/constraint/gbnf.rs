//! llama.cpp's GBNF grammars, translated to the Lark dialect llguidance reads.
//!
//! GBNF (llama.cpp's `grammars/README.md`): rules `name ::= body`, a body of alternatives
//! (`|`) of sequences of string literals (`"..."`), character classes (`[a-z]`, `[^"\\]`),
//! `.` (any character), rule names and parenthesised groups, each optionally repeated by `*`,
//! `+`, `?`, `{m}`, `{m,}` or `{m,n}`; `#` starts a comment; a newline ends a rule unless it is
//! inside parentheses or follows a `|`. The output has one Lark rule per GBNF rule: `root`
//! becomes `start`, rules that only match characters (no recursion) become terminals, which
//! the engine lexes at once rather than parsing character by character.
//!
//! Limits keep a hostile grammar cheap to reject: [`MAX_RULES`] rules, [`MAX_DEPTH`] nested
//! groups, repetition counts up to [`MAX_REPEAT`].

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// Rules in one grammar at most.
pub const MAX_RULES: usize = 4096;
/// Nested parentheses at most.
pub const MAX_DEPTH: usize = 64;
/// The largest count in `{m,n}`.
pub const MAX_REPEAT: u32 = 10_000;

/// A GBNF grammar that does not parse, with where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("GBNF: {message} (line {line}, column {column})")]
pub struct GbnfError {
    /// What is wrong.
    pub message: String,
    /// 1-based line of the source.
    pub line: usize,
    /// 1-based column (in characters).
    pub column: usize,
}

#[derive(Clone, Debug)]
enum Node {
    Lit(String),
    /// A character class as a regular expression (`[...]`), or `.`.
    Class(String),
    Ref(String),
    Seq(Vec<Node>),
    Alt(Vec<Node>),
    Rep(Box<Node>, u32, Option<u32>),
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn err(&self, message: impl Into<String>) -> GbnfError {
        let before = &self.src[..self.pos];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        GbnfError {
            message: message.into(),
            line,
            column,
        }
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    /// Skips blanks and comments, and newlines when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => {
                    self.pos += 1;
                }
                '\r' | '\n' if newlines => {
                    self.pos += 1;
                }
                '#' => {
                    while let Some(c) = self.peek() {
                        if c == '\n' || c == '\r' {
                            break;
                        }
                        self.pos += c.len_utf8();
                    }
                }
                _ => break,
            }
        }
    }

    fn is_name_char(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '-' || c == '_'
    }

    fn name(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(Self::is_name_char) {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.err("expected a rule name"));
        }
        Ok(self.src[start..self.pos].to_string())
    }

    fn hex(&mut self, digits: usize) -> Result<char, GbnfError> {
        let start = self.pos;
        for _ in 0..digits {
            match self.bump() {
                Some(c) if c.is_ascii_hexdigit() => {}
                _ => return Err(self.err(format!("expected {digits} hex digits"))),
            }
        }
        let v = u32::from_str_radix(&self.src[start..self.pos], 16)
            .map_err(|_| self.err("bad hex escape"))?;
        char::from_u32(v).ok_or_else(|| self.err(format!("U+{v:X} is not a character")))
    }

    /// One character of a literal or class, escapes decoded; `None` at the end of input.
    fn char(&mut self) -> Result<(char, bool), GbnfError> {
        match self.bump() {
            None => Err(self.err("unexpected end of the grammar")),
            Some('\\') => {
                let c = match self.bump() {
                    Some('n') => '\n',
                    Some('r') => '\r',
                    Some('t') => '\t',
                    Some('x') => self.hex(2)?,
                    Some('u') => self.hex(4)?,
                    Some('U') => self.hex(8)?,
                    Some(c @ ('"' | '\\' | '[' | ']' | '-' | '^')) => c,
                    Some(c) => return Err(self.err(format!("unknown escape \\{c}"))),
                    None => return Err(self.err("unexpected end of the grammar")),
                };
                Ok((c, true))
            }
            Some(c) => Ok((c, false)),
        }
    }

    fn literal(&mut self) -> Result<Node, GbnfError> {
        self.bump(); // "
        let mut s = String::new();
        loop {
            match self.char()? {
                ('"', false) => return Ok(Node::Lit(s)),
                ('\n', false) => return Err(self.err("a newline inside a string")),
                (c, _) => s.push(c),
            }
        }
    }

    fn class(&mut self) -> Result<Node, GbnfError> {
        self.bump(); // [
        let mut rx = String::from("[");
        if self.peek() == Some('^') {
            self.bump();
            rx.push('^');
        }
        let mut empty = true;
        loop {
            let (c, escaped) = self.char()?;
            if c == ']' && !escaped {
                break;
            }
            push_class_char(&mut rx, c);
            if self.peek() == Some('-') && !self.src[self.pos + 1..].starts_with(']') {
                self.bump();
                let (hi, _) = self.char()?;
                if hi < c {
                    return Err(self.err(format!("the range {c:?}-{hi:?} is reversed")));
                }
                rx.push('-');
                push_class_char(&mut rx, hi);
            }
            empty = false;
        }
        if empty {
            return Err(self.err("an empty character class"));
        }
        rx.push(']');
        Ok(Node::Class(rx))
    }

    fn count(&mut self) -> Result<u32, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let n: u32 = self.src[start..self.pos]
            .parse()
            .map_err(|_| self.err("expected a count"))?;
        if n > MAX_REPEAT {
            return Err(self.err(format!("a count above {MAX_REPEAT}")));
        }
        Ok(n)
    }

    fn repetition(&mut self, node: Node) -> Result<Node, GbnfError> {
        let (lo, hi) = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                self.bump();
                self.space(true);
                let lo = self.count()?;
                self.space(true);
                let hi = match self.bump() {
                    Some('}') => return Ok(Node::Rep(Box::new(node), lo, Some(lo))),
                    Some(',') => {
                        self.space(true);
                        let hi = if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                            Some(self.count()?)
                        } else {
                            None
                        };
                        self.space(true);
                        if self.bump() != Some('}') {
                            return Err(self.err("expected '}'"));
                        }
                        hi
                    }
                    _ => return Err(self.err("expected ',' or '}'")),
                };
                if hi.is_some_and(|h| h < lo) {
                    return Err(self.err(format!(
                        "{{{lo},{}}}: the maximum is below the minimum",
                        hi.unwrap_or(0)
                    )));
                }
                return Ok(Node::Rep(Box::new(node), lo, hi));
            }
            _ => return Ok(node),
        };
        self.bump();
        Ok(Node::Rep(Box::new(node), lo, hi))
    }

    fn sequence(&mut self, nested: bool) -> Result<Node, GbnfError> {
        let mut nodes = Vec::new();
        loop {
            let node = match self.peek() {
                Some('"') => self.literal()?,
                Some('[') => self.class()?,
                Some('(') => self.group()?,
                Some('.') => {
                    self.bump();
                    Node::Class("(?s:.)".into())
                }
                Some(c) if Self::is_name_char(c) => {
                    let start = self.pos;
                    let name = self.name()?;
                    // `name ::=` begins the next rule: this rule ended at the newline before.
                    let save = self.pos;
                    self.space(false);
                    if self.src[self.pos..].starts_with("::=") {
                        self.pos = start;
                        return Err(self.err("a rule definition inside a rule (missing newline?)"));
                    }
                    self.pos = save;
                    Node::Ref(name)
                }
                _ => break,
            };
            self.space(nested);
            let node = self.repetition(node)?;
            nodes.push(node);
            self.space(nested);
        }
        Ok(if nodes.len() == 1 {
            nodes.pop().unwrap_or(Node::Seq(Vec::new()))
        } else {
            Node::Seq(nodes)
        })
    }

    fn alternatives(&mut self, nested: bool) -> Result<Node, GbnfError> {
        let mut alts = vec![self.sequence(nested)?];
        loop {
            self.space(nested);
            if self.peek() != Some('|') {
                break;
            }
            self.bump();
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(if alts.len() == 1 {
            alts.pop().unwrap_or(Node::Seq(Vec::new()))
        } else {
            Node::Alt(alts)
        })
    }

    fn group(&mut self) -> Result<Node, GbnfError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err(format!("groups nested deeper than {MAX_DEPTH}")));
        }
        self.bump(); // (
        self.space(true);
        let node = self.alternatives(true)?;
        if self.bump() != Some(')') {
            return Err(self.err("expected ')'"));
        }
        self.depth -= 1;
        Ok(node)
    }
}

/// Appends `c` to a regex character class, escaped where it means something there.
fn push_class_char(rx: &mut String, c: char) {
    if c.is_ascii_alphanumeric() || c == ' ' {
        rx.push(c);
    } else if c.is_ascii_punctuation() && c != '<' && c != '>' {
        rx.push('\\');
        rx.push(c);
    } else {
        let _ = write!(rx, "\\x{{{:X}}}", c as u32);
    }
}

impl Node {
    fn refs<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Node::Ref(r) => out.push(r),
            Node::Seq(v) | Node::Alt(v) => v.iter().for_each(|n| n.refs(out)),
            Node::Rep(n, ..) => n.refs(out),
            Node::Lit(_) | Node::Class(_) => {}
        }
    }

    fn is_atomic(&self) -> bool {
        !matches!(self, Node::Seq(v) if v.len() != 1) && !matches!(self, Node::Alt(_))
    }

    fn write(&self, names: &HashMap<&str, String>, out: &mut String, top: bool) {
        match self {
            Node::Lit(s) => {
                out.push_str(&serde_json::Value::String(s.clone()).to_string());
            }
            Node::Class(rx) => {
                // A `/` in a class is escaped already (`push_class_char`).
                out.push('/');
                out.push_str(rx);
                out.push('/');
            }
            Node::Ref(r) => out.push_str(&names[r.as_str()]),
            Node::Seq(v) if v.is_empty() => out.push_str("\"\""),
            Node::Seq(v) => {
                for (i, n) in v.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    n.write(names, out, false);
                }
            }
            Node::Alt(v) => {
                if !top {
                    out.push('(');
                }
                for (i, n) in v.iter().enumerate() {
                    if i > 0 {
                        out.push_str(" | ");
                    }
                    n.write(names, out, false);
                }
                if !top {
                    out.push(')');
                }
            }
            Node::Rep(n, lo, hi) => {
                let paren = !n.is_atomic();
                if paren {
                    out.push('(');
                }
                n.write(names, out, false);
                if paren {
                    out.push(')');
                }
                match (lo, hi) {
                    (0, None) => out.push('*'),
                    (1, None) => out.push('+'),
                    (0, Some(1)) => out.push('?'),
                    (lo, None) => {
                        let _ = write!(out, "{{{lo},}}");
                    }
                    (lo, Some(hi)) => {
                        let _ = write!(out, "{{{lo},{hi}}}");
                    }
                }
            }
        }
    }
}

/// Translates a GBNF grammar (with a `root` rule) to llguidance's Lark dialect.
pub fn gbnf_to_lark(src: &str) -> Result<String, GbnfError> {
    let mut p = Parser {
        src,
        pos: 0,
        depth: 0,
    };
    let mut rules: Vec<(String, Node)> = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    p.space(true);
    while p.peek().is_some() {
        let name = p.name()?;
        p.space(false);
        if !p.src[p.pos..].starts_with("::=") {
            return Err(p.err(format!("expected '::=' after the rule name `{name}`")));
        }
        p.pos += 3;
        p.space(true);
        let body = p.alternatives(false)?;
        match p.peek() {
            None | Some('\n' | '\r') => {}
            Some(c) => return Err(p.err(format!("unexpected {c:?}"))),
        }
        if seen.insert(name.clone(), rules.len()).is_some() {
            return Err(p.err(format!("the rule `{name}` is defined twice")));
        }
        rules.push((name, body));
        if rules.len() > MAX_RULES {
            return Err(p.err(format!("more than {MAX_RULES} rules")));
        }
        p.space(true);
    }
    let at_end = |message: String| GbnfError {
        message,
        line: src.matches('\n').count() + 1,
        column: 1,
    };
    if !seen.contains_key("root") {
        return Err(at_end("no `root` rule".into()));
    }
    for (name, body) in &rules {
        let mut refs = Vec::new();
        body.refs(&mut refs);
        if let Some(r) = refs.iter().find(|r| !seen.contains_key(**r)) {
            return Err(at_end(format!(
                "the rule `{name}` uses `{r}`, which is not defined"
            )));
        }
    }
    // Rules that match characters only (through other such rules, never themselves) become
    // terminals; `root` stays a rule (Lark's `start`).
    let mut terminal = vec![false; rules.len()];
    loop {
        let mut changed = false;
        for (i, (name, body)) in rules.iter().enumerate() {
            if terminal[i] || name == "root" {
                continue;
            }
            let mut refs = Vec::new();
            body.refs(&mut refs);
            if refs.iter().all(|r| terminal[seen[*r]]) {
                terminal[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let names: HashMap<&str, String> = rules
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            let clean: String = name
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            let lark = if name == "root" {
                "start".to_string()
            } else if terminal[i] {
                format!("T{i}_{}", clean.to_ascii_uppercase())
            } else {
                format!("r{i}_{}", clean.to_ascii_lowercase())
            };
            (name.as_str(), lark)
        })
        .collect();
    let mut out = String::from("%llguidance {}\n\n");
    for (name, body) in &rules {
        out.push_str(&names[name.as_str()]);
        out.push_str(": ");
        body.write(&names, &mut out, true);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_terminals_and_repetitions() {
        let g = "root ::= greeting (\" \" name){1,3} \"!\"?\n\
                 greeting ::= \"hi\" | \"hello\" # a comment\n\
                 name ::= [A-Z] [a-z]*\n";
        let lark = gbnf_to_lark(g).unwrap();
        assert!(
            lark.contains("start: T1_GREETING (\" \" T2_NAME){1,3} \"!\"?"),
            "{lark}"
        );
        assert!(lark.contains("T1_GREETING: \"hi\" | \"hello\""), "{lark}");
        assert!(lark.contains("T2_NAME: /[A-Z]/ /[a-z]/*"), "{lark}");
    }

    #[test]
    fn recursive_rules_stay_rules() {
        let g =
            "root ::= list\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [0-9]+ | list\n";
        let lark = gbnf_to_lark(g).unwrap();
        assert!(lark.contains("r1_list: "), "{lark}");
        assert!(lark.contains("r2_item: /[0-9]/+ | r1_list"), "{lark}");
    }

    #[test]
    fn escapes_become_json_strings_and_regex_escapes() {
        let g = r#"root ::= "a\"b\\c\n" [^"\\\x7F\x00-\x1F/] "\u00e9""#;
        let lark = gbnf_to_lark(g).unwrap();
        assert!(lark.contains(r#""a\"b\\c\n""#), "{lark}");
        assert!(lark.contains(r#"/[^\"\\\x{7F}\x{0}-\x{1F}\/]/"#), "{lark}");
        assert!(lark.contains("\"é\""), "{lark}");
    }

    #[test]
    fn continuation_lines_after_a_bar_and_inside_groups() {
        let g = "root ::= \"a\" |\n  \"b\"\nx ::= (\n \"c\"\n | \"d\" )\n";
        let lark = gbnf_to_lark(g).unwrap();
        assert!(lark.contains("start: \"a\" | \"b\""), "{lark}");
        assert!(lark.contains("T1_X: \"c\" | \"d\""), "{lark}");
    }

    #[test]
    fn errors_say_what_and_where() {
        let cases = [
            ("root ::= foo\n", "`foo`, which is not defined"),
            ("start ::= \"a\"\n", "no `root` rule"),
            ("root ::= \"a\nb\"", "newline inside a string"),
            ("root ::= [z-a]", "reversed"),
            ("root ::= \"a\"{5,2}", "below the minimum"),
            ("root ::= \"a\"{99999}", "a count above"),
            ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
            ("root = \"a\"", "expected '::='"),
            ("root ::= \"\\q\"", "unknown escape"),
            ("root ::= []", "empty character class"),
            ("root ::= (\"a\"", "expected ')'"),
        ];
        for (g, want) in cases {
            let e = gbnf_to_lark(g).unwrap_err();
            assert!(e.to_string().contains(want), "{g:?}: {e}");
        }
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(200), ")".repeat(200));
        assert!(
            gbnf_to_lark(&deep)
                .unwrap_err()
                .message
                .contains("nested deeper")
        );
    }
}
