//! A check and its vocabulary: where a fact comes from, the settings that govern it, the
//! two sides it asks, and how it ended.

use rknn_matmul::{Platform, Runtime};

use super::observe::{Difference, Observation};

/// Where a fact comes from (the labels of `docs/hardware-facts.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Label {
    /// Rockchip's header, user guide or demo.
    Doc,
    /// Measured on boards by third parties.
    Hw,
    /// Settled by no public source.
    Open,
    /// The emulator's own decision where the board's answer is undocumented.
    Design,
}

impl Label {
    /// "doc", "hw", "open" or "design".
    pub fn name(self) -> &'static str {
        match self {
            Label::Doc => "doc",
            Label::Hw => "hw",
            Label::Open => "open",
            Label::Design => "design",
        }
    }
}

/// The values of a setting the emulator is tried with when a check differs.
#[derive(Clone, Copy, Debug)]
pub enum Values {
    /// These values.
    Fixed(&'static [&'static str]),
    /// The value read off the subject's observation (a count, a size).
    FromSubject(fn(&Observation) -> Option<String>),
}

/// An emulator setting (`RKNN_EMU_*`, or the int4 converter's variable) that governs a fact.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// The variable.
    pub env: &'static str,
    /// The values other than the default to try.
    pub values: Values,
}

/// How thoroughly to check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Every check on small shapes (under a minute on a board).
    #[default]
    Quick,
    /// More shapes, layouts and seeds, and the timing measurements (under ten minutes).
    Full,
}

/// What a check is told.
#[derive(Clone, Copy, Debug)]
pub struct Cx {
    /// Quick or full.
    pub mode: Mode,
    /// Seed of the random inputs.
    pub seed: u64,
}

impl Cx {
    /// Whether this is a full run.
    pub fn full(&self) -> bool {
        self.mode == Mode::Full
    }
}

/// One side of the comparison.
#[derive(Debug)]
pub struct Side<'a> {
    /// The runtime.
    pub rt: &'a Runtime,
}

impl Side<'_> {
    /// The function table.
    pub fn api(&self) -> &rknn_sys::RknnApi {
        self.rt.api()
    }

    /// The chip.
    pub fn platform(&self) -> Platform {
        self.rt.platform()
    }
}

/// Why a check did not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported(pub String);

/// One fact and how to observe it.
#[derive(Debug)]
pub struct Check {
    /// Stable id (`area.name`), as docs and reports cite it.
    pub id: &'static str,
    /// The fact, in one line.
    pub fact: &'static str,
    /// Where the fact comes from.
    pub label: Label,
    /// Why running it on a board is a risk (`None`: safe). Such checks run on a board only
    /// with `--hazardous`; on the emulator and its drop-in they always run.
    pub hazard: Option<&'static str>,
    /// The settings whose non-default values change what this check observes.
    pub settings: &'static [Setting],
    /// Observes the fact on one runtime.
    pub observe: fn(&Side<'_>, &Cx) -> Result<Observation, Unsupported>,
}

/// How a check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The subject answered as the emulator does.
    Agree,
    /// It did not.
    Differs,
    /// The check could not run (the chip has no such type, a function is missing, or it was
    /// skipped as hazardous).
    Unsupported,
}

impl Status {
    /// "agree", "differs" or "unsupported".
    pub fn name(self) -> &'static str {
        match self {
            Status::Agree => "agree",
            Status::Differs => "differs",
            Status::Unsupported => "unsupported",
        }
    }
}

/// The outcome of one check.
#[derive(Clone, Debug)]
pub struct CheckResult {
    /// The check's id.
    pub id: &'static str,
    /// The fact.
    pub fact: &'static str,
    /// Its label.
    pub label: Label,
    /// How it ended.
    pub status: Status,
    /// Why it was unsupported.
    pub reason: Option<String>,
    /// The first difference.
    pub difference: Option<Difference>,
    /// The variables that govern the fact.
    pub settings: Vec<&'static str>,
    /// `VAR=value` under which the emulator answers as the subject did (when it differs and
    /// one does).
    pub matching_setting: Option<String>,
    /// `VAR=value` settings tried without a match.
    pub tried: Vec<String>,
    /// Seconds the check took on both sides.
    pub seconds: f64,
}
