//! How every host kernel of the SDK is chosen: one convention for the emulator's matmul kernels
//! (`rknn-emu`), the engine's glue (`rknn-matmul`) and the LLM's host kernels (`rknn-llm`).
//!
//! Each of these *components* has a scalar reference and SIMD backends that give the same
//! results (bit for bit, or as each component documents); the CPU is probed once per process
//! and the fastest backend it can run is used, unless a variable names another:
//!
//! | variable | applies to |
//! |---|---|
//! | `RKNN_KERNEL` | every component |
//! | `RKNN_KERNEL_EMU`, `RKNN_KERNEL_GLUE`, `RKNN_KERNEL_LLM` | that component, over `RKNN_KERNEL` |
//!
//! A value is a backend's name (`scalar`, `avx2`, `avx512vnni`, `neon`, `neondotprod`; case,
//! `-` and `_` ignored), or `auto` / empty for the default. `RKNN_KERNEL=scalar` is the one switch
//! that rules out a SIMD bug everywhere. A name the component does not have, or that this CPU
//! cannot run, is reported once on stderr and the default is used. Variables are read once,
//! at a component's first kernel call.
//!
//! `rknn-info --kernels` prints the SDK's components' choices (the emulator's, the glue's), what
//! each could have chosen, and why; `llm-decode --kernels` the LLM's.

use std::fmt;

/// The variable that selects the backend of every component.
pub const KERNEL_ENV: &str = "RKNN_KERNEL";

/// The choice of one component's backend, made once per process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelChoice {
    /// The component (`"emu"`, `"glue"`, `"llm"`).
    pub component: &'static str,
    /// The backend its kernels run.
    pub selected: &'static str,
    /// Every backend compiled into this build for this architecture, the reference first.
    pub compiled: Vec<&'static str>,
    /// Those this CPU can run, the reference first and the fastest last.
    pub available: Vec<&'static str>,
    /// The variable and value that chose it, if one did.
    pub set_by: Option<(String, String)>,
    /// Why a variable's value was not followed (an unknown or unavailable name).
    pub ignored: Option<String>,
}

impl KernelChoice {
    /// The component's own variable, e.g. `RKNN_KERNEL_EMU` for `"emu"`.
    pub fn component_env(component: &str) -> String {
        format!("{KERNEL_ENV}_{}", component.to_ascii_uppercase())
    }

    /// Chooses among `compiled` (the reference first) for `component`: the fastest of
    /// `available` (in the same order), unless the environment names another.
    pub fn from_env(
        component: &'static str,
        compiled: &[&'static str],
        available: &[&'static str],
    ) -> KernelChoice {
        let own = KernelChoice::component_env(component);
        let var = [own.as_str(), KERNEL_ENV].into_iter().find_map(|v| {
            let value = std::env::var(v).ok()?;
            Some((v.to_string(), value))
        });
        KernelChoice::choose(component, compiled, available, var)
    }

    /// As [`KernelChoice::from_env`], with the variable and value given (tests).
    pub fn choose(
        component: &'static str,
        compiled: &[&'static str],
        available: &[&'static str],
        var: Option<(String, String)>,
    ) -> KernelChoice {
        let fastest = available
            .last()
            .or(compiled.first())
            .copied()
            .unwrap_or("scalar");
        let mut choice = KernelChoice {
            component,
            selected: fastest,
            compiled: compiled.to_vec(),
            available: available.to_vec(),
            set_by: None,
            ignored: None,
        };
        let Some((name, value)) = var else {
            return choice;
        };
        let wanted = normalise(&value);
        if wanted.is_empty() || wanted == "auto" {
            choice.set_by = Some((name, value));
            return choice;
        }
        match compiled.iter().find(|c| normalise(c) == wanted) {
            Some(&b) if available.contains(&b) => {
                choice.selected = b;
                choice.set_by = Some((name, value));
            }
            Some(b) => {
                choice.ignored = Some(format!(
                    "{name}={value}: `{b}` is not available on this CPU (available: {}); using `{fastest}`",
                    available.join(", ")
                ));
            }
            None => {
                choice.ignored = Some(format!(
                    "{name}={value}: {component} has no backend `{wanted}` (compiled: {}); using `{fastest}`",
                    compiled.join(", ")
                ));
            }
        }
        choice
    }

    /// Reports an ignored variable on stderr, once per choice (call it where the choice is
    /// cached).
    pub fn warn(&self) {
        if let Some(why) = &self.ignored {
            eprintln!("rknn kernels: {why}");
        }
    }
}

impl fmt::Display for KernelChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.component, self.selected)?;
        match (&self.set_by, &self.ignored) {
            (Some((var, value)), _) => write!(f, " (set by {var}={value})")?,
            (None, Some(why)) => write!(f, " (default; {why})")?,
            (None, None) => write!(f, " (fastest available)")?,
        }
        write!(f, "; available: {}", self.available.join(", "))
    }
}

fn normalise(name: &str) -> String {
    name.trim()
        .chars()
        .filter(|c| *c != '-' && *c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMPILED: &[&str] = &["scalar", "avx2", "avx512vnni"];

    fn var(name: &str, value: &str) -> Option<(String, String)> {
        Some((name.into(), value.into()))
    }

    #[test]
    fn the_fastest_available_unless_a_variable_names_another() {
        let c = KernelChoice::choose("emu", COMPILED, &COMPILED[..2], None);
        assert_eq!((c.selected, &c.set_by, &c.ignored), ("avx2", &None, &None));
        let c = KernelChoice::choose(
            "emu",
            COMPILED,
            &COMPILED[..2],
            var("RKNN_KERNEL", "Scalar"),
        );
        assert_eq!(c.selected, "scalar");
        assert_eq!(c.set_by, var("RKNN_KERNEL", "Scalar"));
        let c = KernelChoice::choose("emu", COMPILED, COMPILED, var("RKNN_KERNEL_EMU", "AVX-2"));
        assert_eq!(c.selected, "avx2", "case, - and _ are ignored");
        for auto in ["auto", "", " "] {
            let c = KernelChoice::choose("emu", COMPILED, COMPILED, var("RKNN_KERNEL", auto));
            assert_eq!((c.selected, c.ignored.is_none()), ("avx512vnni", true));
        }
    }

    #[test]
    fn a_name_the_component_lacks_or_the_cpu_cannot_run_is_reported_and_ignored() {
        let c = KernelChoice::choose(
            "glue",
            COMPILED,
            &COMPILED[..2],
            var("RKNN_KERNEL", "avx512vnni"),
        );
        assert_eq!(c.selected, "avx2");
        let why = c.ignored.as_deref().unwrap();
        assert!(why.contains("not available on this CPU"), "{why}");
        let c = KernelChoice::choose("llm", COMPILED, COMPILED, var("RKNN_KERNEL_LLM", "neon"));
        assert_eq!(c.selected, "avx512vnni");
        let why = c.ignored.as_deref().unwrap();
        assert!(why.contains("llm has no backend `neon`"), "{why}");
        assert!(
            c.to_string().starts_with("llm: avx512vnni (default; "),
            "{c}"
        );
    }

    #[test]
    fn the_component_variable_is_named_after_the_component() {
        assert_eq!(KernelChoice::component_env("glue"), "RKNN_KERNEL_GLUE");
    }
}
