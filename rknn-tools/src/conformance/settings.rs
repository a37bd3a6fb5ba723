//! The engine settings that follow from a report: what the runtime answered to each \[open\]
//! fact `rknn-matmul`'s engine (or the LLM on top of it) depends on, and which engine setting
//! that answer leads to.
//!
//! A report keeps, per check, how it ended: `agree` (the subject answered as the default
//! emulator, whose answers are known), `differs` with the first differing item (its key and
//! both values) and the emulator setting that reproduces the subject, if one does, or
//! `unsupported`. The answer is read off that: the decisive item of each check (the create of
//! N = 8192, the bind of the other context's memory...) is found by its key, and when the first
//! difference comes before it, or the report says nothing about it, the answer is "unknown".

use rknn_matmul::Platform;
use serde_json::{Value as Json, json};

use super::check::{CheckResult, Status};
use super::observe::{Difference, code_text};

/// The checks the section covers, in its order.
pub const ENGINE_CHECKS: [&str; 4] = [
    N_LIMIT,
    SHARED_BETWEEN_CONTEXTS,
    CROSS_DOMAIN,
    NATIVE_READ_AT_RUN,
];

const N_LIMIT: &str = "rules.n_limit";
const SHARED_BETWEEN_CONTEXTS: &str = "memory.shared_between_contexts";
const CROSS_DOMAIN: &str = "memory.cross_domain";
const NATIVE_READ_AT_RUN: &str = "sync.native_read_at_run";

/// The N above the user guide's 4096 that `rules.n_limit` creates (its last item).
const WIDE_N: usize = 8192;
/// The user guide's largest N, which the engine falls back to.
const GUIDE_N: usize = 4096;

/// The emulator setting under which `rules.n_limit` refuses N above 4096.
const STRICT_RULES: &str = "RKNN_EMU_STRICT_RULES=1";
/// The emulator setting under which a native input is copied at `set_io_mem`.
const NATIVE_AT_BIND: &str = "RKNN_EMU_NATIVE_INPUTS=bind";

/// One line of the section: a check, what the runtime answered, the engine setting that
/// follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineSetting {
    /// The check's id.
    pub check: &'static str,
    /// What the runtime answered ("N=8192 accepted"), or "not run" / "unknown (why)".
    pub answer: String,
    /// The engine setting that follows ("EngineConfig::max_n_per_context 8192 (...)").
    pub setting: String,
}

impl EngineSetting {
    /// `check: answer -> setting`.
    pub fn line(&self) -> String {
        format!("{}: {} -> {}", self.check, self.answer, self.setting)
    }

    /// `{check, answer, setting}`.
    pub fn to_json(&self) -> Json {
        json!({
            "check": self.check,
            "answer": self.answer,
            "setting": self.setting,
        })
    }
}

/// One line per check of [`ENGINE_CHECKS`], from the results of a run on `platform`.
pub fn engine_settings(platform: Platform, results: &[CheckResult]) -> Vec<EngineSetting> {
    ENGINE_CHECKS
        .iter()
        .map(|&id| {
            let seen = seen(results, id);
            let (answer, setting) = match id {
                N_LIMIT => n_limit(platform, &seen),
                SHARED_BETWEEN_CONTEXTS => shared_between_contexts(&seen),
                CROSS_DOMAIN => cross_domain(&seen),
                _ => native_read_at_run(&seen),
            };
            EngineSetting {
                check: id,
                answer,
                setting,
            }
        })
        .collect()
}

/// What the report says about one check's subject.
#[derive(Debug)]
enum Seen<'a> {
    /// Not selected.
    NotRun,
    /// Unsupported, for this reason.
    Unsupported(&'a str),
    /// Every item as the default emulator's.
    AsReference,
    /// Differs, first at `d`; `setting` is the `VAR=value` under which the emulator answers
    /// every item as the subject did, when one does.
    Differs {
        d: &'a Difference,
        setting: Option<&'a str>,
    },
    /// Differs, but the report holds no difference (not made by `run_check`).
    Unexplained,
}

fn seen<'a>(results: &'a [CheckResult], id: &str) -> Seen<'a> {
    let Some(r) = results.iter().find(|r| r.id == id) else {
        return Seen::NotRun;
    };
    match (r.status, &r.difference) {
        (Status::Unsupported, _) => {
            Seen::Unsupported(r.reason.as_deref().unwrap_or("no reason given"))
        }
        (Status::Agree, _) => Seen::AsReference,
        (Status::Differs, Some(d)) => Seen::Differs {
            d,
            setting: r.matching_setting.as_deref(),
        },
        (Status::Differs, None) => Seen::Unexplained,
    }
}

/// What the subject answered to one question.
enum Answer {
    /// Nothing to say; the text says why ("not run", "unknown (...)").
    Unknown(String),
    /// The optimistic answer the engine's default assumes, described.
    Yes(String),
    /// The other answer, described.
    No(String),
}

/// The answer when the report does not settle the question: not run, unsupported, or a
/// first difference (`d`) that is not the item the question is about (`what`).
fn unknown(seen: &Seen<'_>, what: &str) -> Answer {
    Answer::Unknown(match seen {
        Seen::NotRun => "not run (not selected)".into(),
        Seen::Unsupported(why) => format!("unknown (unsupported: {why})"),
        Seen::Unexplained => "unknown (differs; the report holds no difference)".into(),
        Seen::AsReference => "unknown".into(),
        Seen::Differs { d, setting } => format!(
            "unknown (the first difference, at \"{}\": {} instead of {}, is not {what}{})",
            d.key,
            d.subject,
            d.reference,
            setting
                .map(|s| format!("; the emulator matches with {s}"))
                .unwrap_or_default()
        ),
    })
}

/// The return code a difference shows for the subject ("-5 (RKNN_ERR_PARAM_INVALID)"), or
/// `None` when the item is no code (a matrix element, a missing or renamed item).
fn subject_code(d: &Difference) -> Option<i32> {
    code_of(&d.subject)
}

fn code_of(text: &str) -> Option<i32> {
    let (num, rest) = text.split_once(' ')?;
    let name = rest.strip_prefix('(')?.strip_suffix(')')?;
    if name.contains(" = ") {
        return None;
    }
    num.parse().ok()
}

/// The item's key ends with `: {step}` (keys are "what was done: step").
fn step_is(d: &Difference, step: &str) -> bool {
    d.key.ends_with(&format!(": {step}"))
}

fn n_limit(platform: Platform, seen: &Seen<'_>) -> (String, String) {
    let what = format!("the create of N={WIDE_N}");
    let at_wide = |d: &Difference| {
        step_is(d, "create")
            && d.key
                .split_whitespace()
                .any(|w| w == format!("N={WIDE_N}:"))
    };
    let answer = match seen {
        Seen::AsReference => Answer::Yes(format!("N={WIDE_N} accepted")),
        Seen::Differs { d, .. } if at_wide(d) => match subject_code(d) {
            Some(0) => Answer::Yes(format!("N={WIDE_N} accepted")),
            Some(c) => Answer::No(format!("N={WIDE_N} refused ({})", code_text(c))),
            None => unknown(seen, &what),
        },
        // The user guide's rule refuses every N above 4096: the first difference is at a
        // smaller N, and the setting says how the rest went.
        Seen::Differs {
            setting: Some(s), ..
        } if *s == STRICT_RULES => Answer::No(format!(
            "N={WIDE_N} refused (every N above {GUIDE_N} is, as by the emulator under {s})"
        )),
        _ => unknown(seen, &what),
    };
    let measured = platform.measured_max_n();
    let chip = platform.name();
    let setting = match (&answer, measured) {
        (Answer::Yes(_), Some(WIDE_N)) => {
            format!("EngineConfig::max_n_per_context {WIDE_N} (the engine's probe finds the same)")
        }
        (Answer::No(_), Some(m)) if m > GUIDE_N => format!(
            "EngineConfig::max_n_per_context {GUIDE_N} (the engine's probe finds the same: more contexts per linear, so more handles and per-call overhead)"
        ),
        (Answer::Yes(_) | Answer::No(_), None) => format!(
            "EngineConfig::max_n_per_context {GUIDE_N} (the default on {chip}: no N above {GUIDE_N} is measured on it)"
        ),
        (Answer::Yes(_) | Answer::No(_), Some(m)) => format!(
            "EngineConfig::max_n_per_context: the engine's probe tries N={m} (this check creates N={WIDE_N})"
        ),
        (Answer::Unknown(_), Some(m)) if m > GUIDE_N => format!(
            "EngineConfig::max_n_per_context: the engine's probe decides when it starts ({m} if accepted, else {GUIDE_N})"
        ),
        (Answer::Unknown(_), _) => {
            format!("EngineConfig::max_n_per_context {GUIDE_N} (the default on {chip})")
        }
    };
    (text(answer), setting)
}

fn shared_between_contexts(seen: &Seen<'_>) -> (String, String) {
    let answer = match seen {
        Seen::AsReference => Answer::Yes(
            "accepted (a memory of another context of the same domain is bound, and the run's C is right)"
                .into(),
        ),
        Seen::Differs { d, .. } if step_is(d, "set_io_mem A") => match subject_code(d) {
            Some(c) if c != 0 => Answer::No(format!("refused at set_io_mem ({})", code_text(c))),
            _ => unknown(seen, "the bind's refusal"),
        },
        Seen::Differs { d, .. } if step_is(d, "run") => match subject_code(d) {
            Some(c) if c != 0 => {
                Answer::No(format!("bound, but the run fails ({})", code_text(c)))
            }
            _ => unknown(seen, "the run's failure"),
        },
        Seen::Differs { d, .. } if step_is(d, "C") => {
            let at = d
                .index
                .map(|(i, j)| format!(" at [{i}, {j}]"))
                .unwrap_or_default();
            Answer::No(format!(
                "bound and run, but C is wrong{at} ({} instead of {})",
                d.subject, d.reference
            ))
        }
        _ => unknown(seen, "the bind of the other context's memory"),
    };
    let setting = match answer {
        Answer::Yes(_) => {
            "EngineConfig::share_io_memories on: one A and one C per core (the engine's probe finds the same)"
        }
        Answer::No(_) => {
            "EngineConfig::share_io_memories falls back to off: each context gets its own A and C, 2 more NPU memory handles per context (the engine's probe finds the same)"
        }
        Answer::Unknown(_) => {
            "EngineConfig::share_io_memories: the engine's probe decides when it starts (shared if accepted, else per-context A and C)"
        }
    };
    (text(answer), setting.into())
}

fn cross_domain(seen: &Seen<'_>) -> (String, String) {
    let answer = match seen {
        Seen::AsReference => {
            Answer::Yes("refused at set_io_mem (a memory of IOMMU domain 1 in domain 0)".into())
        }
        Seen::Differs { d, .. } if step_is(d, "set_io_mem A") => match subject_code(d) {
            Some(0) => {
                Answer::No("accepted at set_io_mem (a memory of IOMMU domain 1 in domain 0)".into())
            }
            Some(c) => Answer::Yes(format!(
                "refused at set_io_mem with {} (the emulator: {})",
                code_text(c),
                d.reference
            )),
            None => unknown(seen, "the bind across domains"),
        },
        _ => unknown(seen, "the bind across domains"),
    };
    let setting = "nothing follows (the engine never binds across domains: each linear's memories are in one domain)";
    (text(answer), setting.into())
}

fn native_read_at_run(seen: &Seen<'_>) -> (String, String) {
    let answer = match seen {
        Seen::AsReference => {
            Answer::Yes("read at every run (a synced write is seen without binding again)".into())
        }
        Seen::Differs {
            setting: Some(s), ..
        } if *s == NATIVE_AT_BIND => Answer::No(format!(
            "copied at set_io_mem (a synced write is not seen until bound again, as by the emulator under {s})"
        )),
        Seen::Differs { d, setting: None }
            if step_is(d, "C") && d.key.contains("not bound again") =>
        {
            Answer::Unknown(format!(
                "unknown (after a rewrite without binding again, C is neither the new nor the old product: {} instead of {})",
                d.subject, d.reference
            ))
        }
        _ => unknown(seen, "the C after the rewrite"),
    };
    let setting = "nothing follows (the engine binds A again after writing it, before every run, and writes B before its first bind)";
    (text(answer), setting.into())
}

fn text(a: Answer) -> String {
    match a {
        Answer::Unknown(s) | Answer::Yes(s) | Answer::No(s) => s,
    }
}

#[cfg(test)]
mod tests {
    use super::super::check::{Cx, Label, Side};
    use super::super::observe::{self, Item, Observation, Value};
    use super::super::{CHECKS, Options, emulator, run_check};
    use super::*;

    fn check(id: &str) -> &'static super::super::Check {
        CHECKS.iter().find(|c| c.id == id).unwrap()
    }

    /// The check's result with the emulator under `overrides` as the subject, as
    /// `conformance::run` makes it.
    fn run_on(p: Platform, id: &str, overrides: &[(&str, &str)]) -> CheckResult {
        let subject = emulator(p, overrides).unwrap();
        let reference = emulator(p, &[]).unwrap();
        run_check(check(id), &subject, &reference, &Options::default())
    }

    /// The default emulator's observation of the check.
    fn reference_items(p: Platform, id: &str) -> Observation {
        let rt = emulator(p, &[]).unwrap();
        let cx = Cx {
            mode: Options::default().mode,
            seed: Options::default().seed,
        };
        (check(id).observe)(&Side { rt: &rt }, &cx).unwrap()
    }

    /// A result as `run_check` makes it, without a difference.
    fn result(id: &'static str, status: Status) -> CheckResult {
        CheckResult {
            id,
            fact: check(id).fact,
            label: Label::Open,
            status,
            reason: None,
            difference: None,
            settings: Vec::new(),
            matching_setting: None,
            tried: Vec::new(),
            seconds: 0.0,
        }
    }

    /// A `differs` result for a subject that observed `subject` (no emulator setting
    /// reproducing it).
    fn differs(p: Platform, id: &'static str, subject: &[Item]) -> CheckResult {
        let d = observe::compare(subject, &reference_items(p, id)).expect("a difference");
        CheckResult {
            difference: Some(d),
            ..result(id, Status::Differs)
        }
    }

    fn unsupported(id: &'static str, why: &str) -> CheckResult {
        CheckResult {
            reason: Some(why.into()),
            ..result(id, Status::Unsupported)
        }
    }

    fn line(p: Platform, results: &[CheckResult], id: &str) -> EngineSetting {
        engine_settings(p, results)
            .into_iter()
            .find(|s| s.check == id)
            .unwrap()
    }

    /// The reference's items with the code of the item whose key ends with `step` replaced,
    /// and nothing after it when `stop` (a check stops recording after a failure).
    fn with_code(mut items: Observation, step: &str, rc: i32, stop: bool) -> Observation {
        let i = items
            .iter()
            .position(|it| it.key.ends_with(step))
            .unwrap_or_else(|| panic!("no item {step} in {items:?}"));
        items[i].value = Value::Code(rc);
        if stop {
            items.truncate(i + 1);
        }
        items
    }

    #[test]
    fn the_default_emulator_answers_as_agree_is_read() {
        // `agree` means "as the default emulator": these are its answers.
        let p = Platform::Rk3588;
        let n = reference_items(p, N_LIMIT);
        let wide = n.iter().find(|i| i.key.contains("N=8192:")).unwrap();
        assert_eq!(wide.value, Value::Code(0));
        let shared = reference_items(p, SHARED_BETWEEN_CONTEXTS);
        let bind = shared
            .iter()
            .find(|i| i.key.ends_with(": set_io_mem A"))
            .unwrap();
        assert_eq!(bind.value, Value::Code(0));
        assert!(shared.iter().any(|i| i.key.ends_with(": C")));
        let cross = reference_items(p, CROSS_DOMAIN);
        let last = cross.last().unwrap();
        assert!(last.key.ends_with(": set_io_mem A"), "{cross:?}");
        assert_ne!(last.value, Value::Code(0));
        // Under "bind" the emulator differs exactly at the C after the rewrite: the default
        // reads at run.
        let r = run_on(p, NATIVE_READ_AT_RUN, &[("RKNN_EMU_NATIVE_INPUTS", "bind")]);
        assert!(r.difference.unwrap().key.contains("not bound again: C"));
    }

    #[test]
    fn n_limit_accepted() {
        let p = Platform::Rk3588;
        let r = run_on(p, N_LIMIT, &[]);
        assert_eq!(r.status, Status::Agree);
        let s = line(p, &[r], N_LIMIT);
        assert_eq!(
            s.line(),
            "rules.n_limit: N=8192 accepted -> EngineConfig::max_n_per_context 8192 (the engine's probe finds the same)"
        );
    }

    #[test]
    fn n_limit_accepted_on_a_chip_without_a_measured_wider_n() {
        let p = Platform::Rk3576;
        let s = line(p, &[run_on(p, N_LIMIT, &[])], N_LIMIT);
        assert_eq!(s.answer, "N=8192 accepted");
        assert!(
            s.setting
                .starts_with("EngineConfig::max_n_per_context 4096 (the default on rk3576"),
            "{s:?}"
        );
    }

    #[test]
    fn n_limit_refused_at_8192_only() {
        let p = Platform::Rk3588;
        let subject = with_code(reference_items(p, N_LIMIT), "N=8192: create", -5, false);
        let s = line(p, &[differs(p, N_LIMIT, &subject)], N_LIMIT);
        assert_eq!(s.answer, "N=8192 refused (-5 (RKNN_ERR_PARAM_INVALID))");
        assert!(
            s.setting.starts_with(
                "EngineConfig::max_n_per_context 4096 (the engine's probe finds the same"
            ),
            "{s:?}"
        );
    }

    #[test]
    fn n_limit_refused_as_the_user_guide_says() {
        let p = Platform::Rk3588;
        let r = run_on(p, N_LIMIT, &[("RKNN_EMU_STRICT_RULES", "1")]);
        // The first difference is at N=4128, before 8192: the matching setting tells the rest.
        assert!(r.difference.as_ref().unwrap().key.contains("N=4128"));
        let s = line(p, &[r], N_LIMIT);
        assert!(s.answer.starts_with("N=8192 refused"), "{s:?}");
        assert!(
            s.setting
                .starts_with("EngineConfig::max_n_per_context 4096")
        );
    }

    #[test]
    fn n_limit_unknown_when_it_differs_before_8192() {
        let p = Platform::Rk3588;
        let subject = with_code(reference_items(p, N_LIMIT), "N=4128: create", -5, false);
        let s = line(p, &[differs(p, N_LIMIT, &subject)], N_LIMIT);
        assert!(
            s.answer.starts_with("unknown (the first difference"),
            "{s:?}"
        );
        assert!(s.answer.contains("N=4128"), "{s:?}");
        assert!(s.setting.contains("the engine's probe decides"), "{s:?}");
    }

    #[test]
    fn not_run_and_unsupported() {
        let p = Platform::Rk3588;
        let all = engine_settings(p, &[]);
        assert_eq!(
            all.iter().map(|s| s.check).collect::<Vec<_>>(),
            ENGINE_CHECKS
        );
        assert!(all.iter().all(|s| s.answer == "not run (not selected)"));
        let r = unsupported(SHARED_BETWEEN_CONTEXTS, "the runtime does not export x");
        let s = line(p, &[r], SHARED_BETWEEN_CONTEXTS);
        assert_eq!(
            s.answer,
            "unknown (unsupported: the runtime does not export x)"
        );
        assert!(s.setting.contains("the engine's probe decides"));
        let j = s.to_json();
        assert_eq!(j["check"], SHARED_BETWEEN_CONTEXTS);
        assert_eq!(j["answer"], s.answer);
        assert_eq!(j["setting"], s.setting);
    }

    #[test]
    fn shared_memory_accepted() {
        let p = Platform::Rk3588;
        let s = line(
            p,
            &[run_on(p, SHARED_BETWEEN_CONTEXTS, &[])],
            SHARED_BETWEEN_CONTEXTS,
        );
        assert!(s.answer.starts_with("accepted"), "{s:?}");
        assert!(s.setting.starts_with("EngineConfig::share_io_memories on"));
    }

    #[test]
    fn shared_memory_refused_at_bind() {
        let p = Platform::Rk3588;
        let subject = with_code(
            reference_items(p, SHARED_BETWEEN_CONTEXTS),
            ": set_io_mem A",
            -5,
            true,
        );
        let s = line(
            p,
            &[differs(p, SHARED_BETWEEN_CONTEXTS, &subject)],
            SHARED_BETWEEN_CONTEXTS,
        );
        assert_eq!(
            s.answer,
            "refused at set_io_mem (-5 (RKNN_ERR_PARAM_INVALID))"
        );
        assert!(
            s.setting
                .starts_with("EngineConfig::share_io_memories falls back to off"),
            "{s:?}"
        );
        // A setting that reproduces it does not hide the code.
        let r = CheckResult {
            matching_setting: Some("RKNN_EMU_SHARED_MEMORIES=refuse".into()),
            ..differs(p, SHARED_BETWEEN_CONTEXTS, &subject)
        };
        assert_eq!(line(p, &[r], SHARED_BETWEEN_CONTEXTS), s);
    }

    #[test]
    fn shared_memory_bound_but_wrong() {
        let p = Platform::Rk3588;
        let mut subject = reference_items(p, SHARED_BETWEEN_CONTEXTS);
        let c = subject.last_mut().unwrap();
        assert!(c.key.ends_with(": C"));
        let Value::Ints { data, .. } = &mut c.value else {
            panic!("{c:?}")
        };
        data[1] += 1;
        let s = line(
            p,
            &[differs(p, SHARED_BETWEEN_CONTEXTS, &subject)],
            SHARED_BETWEEN_CONTEXTS,
        );
        assert!(
            s.answer
                .starts_with("bound and run, but C is wrong at [0, 1]"),
            "{s:?}"
        );
        assert!(s.setting.contains("falls back to off"));
    }

    #[test]
    fn cross_domain_refused() {
        let p = Platform::Rk3588;
        let s = line(p, &[run_on(p, CROSS_DOMAIN, &[])], CROSS_DOMAIN);
        assert!(s.answer.starts_with("refused at set_io_mem"), "{s:?}");
        assert!(s.setting.starts_with("nothing follows"));
    }

    #[test]
    fn cross_domain_accepted() {
        let p = Platform::Rk3588;
        let mut subject = with_code(reference_items(p, CROSS_DOMAIN), ": set_io_mem A", 0, true);
        // Bound, the check goes on to bind B and C (and runs nothing across domains).
        let key = subject[subject.len() - 1].key.replace("set_io_mem A", "");
        for m in ["B", "C"] {
            subject.push(Item::new(format!("{key}set_io_mem {m}"), Value::Code(0)));
        }
        let s = line(p, &[differs(p, CROSS_DOMAIN, &subject)], CROSS_DOMAIN);
        assert!(s.answer.starts_with("accepted at set_io_mem"), "{s:?}");
        assert!(s.setting.starts_with("nothing follows"));
    }

    #[test]
    fn native_input_read_at_run() {
        let p = Platform::Rk3588;
        let s = line(p, &[run_on(p, NATIVE_READ_AT_RUN, &[])], NATIVE_READ_AT_RUN);
        assert!(s.answer.starts_with("read at every run"), "{s:?}");
        assert_eq!(
            s.setting,
            "nothing follows (the engine binds A again after writing it, before every run, and writes B before its first bind)"
        );
    }

    #[test]
    fn native_input_copied_at_bind() {
        let p = Platform::Rk3588;
        let r = run_on(p, NATIVE_READ_AT_RUN, &[("RKNN_EMU_NATIVE_INPUTS", "bind")]);
        assert_eq!(r.matching_setting.as_deref(), Some(NATIVE_AT_BIND));
        let s = line(p, &[r], NATIVE_READ_AT_RUN);
        assert!(s.answer.starts_with("copied at set_io_mem"), "{s:?}");
        assert!(s.setting.starts_with("nothing follows"));
    }

    #[test]
    fn codes_are_read_strictly() {
        assert_eq!(code_of("0 (RKNN_SUCC)"), Some(0));
        assert_eq!(code_of("-5 (RKNN_ERR_PARAM_INVALID)"), Some(-5));
        // A renamed item ("key = value") or a matrix element is no code.
        assert_eq!(code_of("create (domain 0) = 0 (RKNN_SUCC)"), None);
        assert_eq!(code_of("-10"), None);
        assert_eq!(code_of("nothing (the subject stopped earlier)"), None);
    }
}
