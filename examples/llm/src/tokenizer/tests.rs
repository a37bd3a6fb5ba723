//! Unit tests on small hand-made vocabularies.
