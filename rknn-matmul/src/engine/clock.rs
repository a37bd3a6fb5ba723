//! The clock of the engine's phase statistics: the CPU's constant-rate counter where it has
//! one, `Instant` elsewhere.
//!
//! Why not `Instant` everywhere: a decode forward reads the clock about 13 times over its
//! lanes, and those reads cost 1.1 % of a token (in-process ABBA of the decode bench with all of
//! them switched off, median 1.011 over 200 pairs, 2026-12-02). On x86-64 Linux `Instant::now`
//! is the vDSO's `clock_gettime`, which orders its counter read (`rdtscp` or `lfence; rdtsc`)
//! so that it waits for the loads before it, a memory-bound kernel's included, and reads the
//! kernel's conversion data from a page that a token's 134 MB of weights have long evicted.
//! The statistics only add up intervals, so an unordered read of the counter is enough: a read
//! that drifts by a few dozen cycles against the instructions around it moves time between two
//! neighbouring phases, not out of the total. Measured the same way, this clock against
//! `Instant`: medians 1.011 and 1.010 over 200 pairs (2026-12-02, 11:54 UTC), all of the cost.
//!
//! The counter is used only where its rate is constant and known:
//! - x86-64 with an invariant TSC (CPUID leaf 0x8000_0007, EDX bit 8: "the TSC rate is
//!   invariant in all ACPI P-, C- and T-states", Intel SDM vol. 3 §17.17 and AMD APM vol. 2
//!   §13.2.4), its rate measured once against `Instant` (1 ms, at the first read);
//! - aarch64's virtual counter `CNTVCT_EL0`, whose rate the architecture fixes and reports in
//!   `CNTFRQ_EL0` (Arm ARM D11.1; on RK3588 it is 24 MHz, so a single interval is coarse, but
//!   the sums the statistics keep are not biased).
//!
//! Anything else (other targets, a TSC without the invariant bit, Miri) uses `Instant`.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A reading of the clock, in its ticks. Only differences of two readings mean anything.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tick(u64);

impl Tick {
    /// Ticks from `earlier` to `self` (0 if the counter went backwards, which a constant-rate
    /// counter does only across CPUs that disagree; the statistics then lose that interval).
    pub(crate) fn since(self, earlier: Tick) -> Ticks {
        Ticks(self.0.saturating_sub(earlier.0))
    }
}

/// A span of ticks, convertible to a duration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ticks(pub(crate) u64);

impl Ticks {
    /// The span in nanoseconds (rounded down; saturating at `u64::MAX`).
    pub(crate) fn nanos(self) -> u64 {
        match source() {
            Source::Counter { ns_per_tick } => (self.0 as f64 * ns_per_tick) as u64,
            Source::Instant(_) => self.0,
        }
    }

    /// The span as a duration.
    pub(crate) fn duration(self) -> Duration {
        Duration::from_nanos(self.nanos())
    }
}

impl std::ops::AddAssign for Ticks {
    fn add_assign(&mut self, rhs: Ticks) {
        self.0 = self.0.saturating_add(rhs.0);
    }
}

/// Where the ticks come from, chosen once per process.
enum Source {
    /// The CPU's counter, at the measured (x86-64) or reported (aarch64) rate.
    Counter { ns_per_tick: f64 },
    /// Nanoseconds since this origin.
    Instant(Instant),
}

fn source() -> &'static Source {
    static SOURCE: OnceLock<Source> = OnceLock::new();
    SOURCE.get_or_init(|| match counter::ns_per_tick() {
        Some(ns_per_tick) if ns_per_tick.is_finite() && ns_per_tick > 0.0 => {
            Source::Counter { ns_per_tick }
        }
        _ => Source::Instant(Instant::now()),
    })
}

/// Reads the clock.
#[inline]
pub(crate) fn now() -> Tick {
    match source() {
        Source::Counter { .. } => Tick(counter::read()),
        // u64 nanoseconds last 584 years.
        Source::Instant(origin) => Tick(origin.elapsed().as_nanos() as u64),
    }
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
mod counter {
    use std::time::{Duration, Instant};

    /// The time-stamp counter, unfenced.
    #[inline]
    pub(super) fn read() -> u64 {
        // SAFETY: RDTSC exists on every x86-64 CPU and reads no memory; `source` uses this only
        // when CPUID said the counter's rate is invariant. (`unused_unsafe`: newer compilers
        // made the intrinsic safe; the MSRV's still needs the block.)
        #[allow(unused_unsafe)]
        unsafe {
            std::arch::x86_64::_rdtsc()
        }
    }

    /// CPUID: whether the TSC's rate is invariant (leaf 0x8000_0007, EDX bit 8).
    fn invariant() -> bool {
        use std::arch::x86_64::__cpuid;
        // SAFETY: CPUID exists on every x86-64 CPU; the extended leaf is read only when the
        // maximum extended leaf (leaf 0x8000_0000's EAX) says it exists.
        #[allow(unused_unsafe)]
        unsafe {
            __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
        }
    }

    /// An `Instant` and the counter read around it, from a try whose two counter reads were
    /// close (not interrupted between them).
    fn pair() -> (Instant, u64) {
        let mut best = None;
        for _ in 0..64 {
            let a = read();
            let i = Instant::now();
            let b = read();
            let gap = b.wrapping_sub(a);
            if best.is_none_or(|(_, _, g)| gap < g) {
                best = Some((i, a / 2 + b / 2 + (a % 2 + b % 2) / 2, gap));
            }
            if gap < 2_000 {
                break;
            }
        }
        let (i, t, _) = best.expect("at least one try");
        (i, t)
    }

    /// Nanoseconds per tick, measured over 1 ms against `Instant`; `None` without an
    /// invariant TSC.
    pub(super) fn ns_per_tick() -> Option<f64> {
        if !invariant() {
            return None;
        }
        let (i0, t0) = pair();
        while i0.elapsed() < Duration::from_millis(1) {
            std::hint::spin_loop();
        }
        let (i1, t1) = pair();
        let ticks = t1.checked_sub(t0).filter(|&t| t > 0)?;
        Some((i1 - i0).as_nanos() as f64 / ticks as f64)
    }
}

#[cfg(all(target_arch = "aarch64", not(miri)))]
mod counter {
    /// The virtual counter. Without an ISB before it the read may be taken a few instructions
    /// early, which only moves time between neighbouring phases (see the module's docs).
    #[inline]
    pub(super) fn read() -> u64 {
        let v: u64;
        // SAFETY: CNTVCT_EL0 is readable from EL0 on Linux (the kernel sets CNTKCTL_EL1.EL0VCTEN
        // for the vDSO); the read touches no memory and no flags.
        unsafe {
            std::arch::asm!("mrs {}, cntvct_el0", out(reg) v, options(nomem, nostack, preserves_flags))
        };
        v
    }

    /// Nanoseconds per tick, from the counter's reported frequency.
    pub(super) fn ns_per_tick() -> Option<f64> {
        let f: u64;
        // SAFETY: as for CNTVCT_EL0 above; CNTFRQ_EL0 is readable from EL0.
        unsafe {
            std::arch::asm!("mrs {}, cntfrq_el0", out(reg) f, options(nomem, nostack, preserves_flags))
        };
        (f > 0).then(|| 1e9 / f as f64)
    }
}

#[cfg(any(not(any(target_arch = "x86_64", target_arch = "aarch64")), miri))]
mod counter {
    pub(super) fn read() -> u64 {
        unreachable!("no counter source on this target: `source` chose Instant")
    }

    pub(super) fn ns_per_tick() -> Option<f64> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clock against `Instant` over a sleep: whichever source this machine uses, its
    /// durations are `Instant`'s within 2 % (the calibration is good to far better; the rest is
    /// the reads' own placement around the sleep).
    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri's clock is simulated: a sleep is not the time it reports"
    )]
    fn a_span_measures_what_instant_measures() {
        for _ in 0..3 {
            let (i0, t0) = (Instant::now(), now());
            std::thread::sleep(Duration::from_millis(30));
            let (t1, i1) = (now(), Instant::now());
            let ours = t1.since(t0).nanos() as f64;
            let theirs = (i1 - i0).as_nanos() as f64;
            let ratio = ours / theirs;
            if (0.98..=1.001).contains(&ratio) {
                return;
            }
            eprintln!("clock {ours} ns against Instant {theirs} ns; trying again");
        }
        panic!("the phase clock disagreed with Instant three times");
    }

    #[test]
    fn spans_saturate_instead_of_wrapping() {
        assert_eq!(
            Tick(5).since(Tick(9)),
            Ticks(0),
            "a reading before the start"
        );
        assert_eq!(Tick(9).since(Tick(5)), Ticks(4));
        let mut s = Ticks(5);
        s += Ticks(u64::MAX);
        assert_eq!(s, Ticks(u64::MAX));
    }
}
