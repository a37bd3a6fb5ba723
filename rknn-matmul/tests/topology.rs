//! CPU topology from fake sysfs trees, big/little classification, the pinning policy, and
//! pinning a real thread.

use rknn_matmul::engine::topology::{CpuInfo, CpuTopology, Pinning, pin_current_thread};
use std::fs;
use std::path::{Path, PathBuf};

/// A fresh, empty directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "rknn-topology-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Writes a sysfs tree: `list` into `file` (e.g. `possible`) if given, and a `cpuN` directory
/// per entry of `freqs`, with `cpufreq/cpuinfo_max_freq` when the frequency is `Some`.
fn fake_sysfs(root: &Path, list: Option<(&str, &str)>, freqs: &[(usize, Option<u64>)]) {
    let base = root.join("sys/devices/system/cpu");
    fs::create_dir_all(&base).unwrap();
    if let Some((file, text)) = list {
        fs::write(base.join(file), text).unwrap();
    }
    // Entries sysfs also has, which must not be mistaken for CPUs.
    fs::create_dir_all(base.join("cpufreq")).unwrap();
    fs::create_dir_all(base.join("cpuidle")).unwrap();
    for &(id, freq) in freqs {
        let dir = base.join(format!("cpu{id}"));
        fs::create_dir_all(&dir).unwrap();
        if let Some(f) = freq {
            fs::create_dir_all(dir.join("cpufreq")).unwrap();
            fs::write(dir.join("cpufreq/cpuinfo_max_freq"), format!("{f}\n")).unwrap();
        }
    }
}

#[test]
fn rk3588_big_cores_are_the_a76s() {
    let tmp = TempDir::new("rk3588");
    let freqs: Vec<_> = (0..8)
        .map(|i| (i, Some(if i < 4 { 1_800_000 } else { 2_304_000 })))
        .collect();
    fake_sysfs(&tmp.0, Some(("possible", "0-7\n")), &freqs);
    let topo = CpuTopology::from_sysfs(&tmp.0).unwrap();
    assert_eq!(topo.cpus.len(), 8);
    assert_eq!(
        topo.cpus[4],
        CpuInfo {
            id: 4,
            max_freq_khz: Some(2_304_000)
        }
    );
    assert_eq!(topo.big_cores(), [4, 5, 6, 7]);
    assert_eq!(topo.little_cores(), [0, 1, 2, 3]);
    assert!(topo.is_heterogeneous());
    assert_eq!(Pinning::default(), Pinning::BigCores);
    assert_eq!(Pinning::BigCores.cpus(&topo), Some(vec![4, 5, 6, 7]));
    assert_eq!(Pinning::Cpus(vec![5, 6]).cpus(&topo), Some(vec![5, 6]));
    assert_eq!(Pinning::None.cpus(&topo), None);
}

#[test]
fn online_list_takes_precedence_over_possible() {
    let tmp = TempDir::new("online");
    let freqs: Vec<_> = (0..8)
        .map(|i| (i, Some(if i < 4 { 1_800_000 } else { 2_304_000 })))
        .collect();
    fake_sysfs(&tmp.0, Some(("possible", "0-7")), &freqs);
    // cpu5 hot-unplugged.
    fs::write(tmp.0.join("sys/devices/system/cpu/online"), "0-4,6-7\n").unwrap();
    let topo = CpuTopology::from_sysfs(&tmp.0).unwrap();
    let ids: Vec<_> = topo.cpus.iter().map(|c| c.id).collect();
    assert_eq!(ids, [0, 1, 2, 3, 4, 6, 7]);
    assert_eq!(topo.big_cores(), [4, 6, 7]);
}

#[test]
fn homogeneous_quad_core_is_all_big() {
    let tmp = TempDir::new("homog");
    let freqs: Vec<_> = (0..4).map(|i| (i, Some(2_000_000))).collect();
    fake_sysfs(&tmp.0, Some(("online", "0-3")), &freqs);
    let topo = CpuTopology::from_sysfs(&tmp.0).unwrap();
    assert_eq!(topo.big_cores(), [0, 1, 2, 3]);
    assert!(topo.little_cores().is_empty());
    assert!(!topo.is_heterogeneous());
    // Pinning to every CPU would change nothing: no pinning.
    assert_eq!(Pinning::BigCores.cpus(&topo), None);
    assert_eq!(Pinning::None.cpus(&topo), None);
}

#[test]
fn missing_cpufreq_means_all_cpus_and_homogeneous() {
    let tmp = TempDir::new("nofreq");
    let freqs: Vec<_> = (0..6).map(|i| (i, None)).collect();
    fake_sysfs(&tmp.0, Some(("possible", "0-5")), &freqs);
    let topo = CpuTopology::from_sysfs(&tmp.0).unwrap();
    assert!(topo.cpus.iter().all(|c| c.max_freq_khz.is_none()));
    assert_eq!(topo.big_cores(), [0, 1, 2, 3, 4, 5]);
    assert!(topo.little_cores().is_empty());
    assert!(!topo.is_heterogeneous());
    assert_eq!(Pinning::BigCores.cpus(&topo), None);
}

#[test]
fn rk3576_like_four_plus_four() {
    // RK3576: cpu0-3 Cortex-A53 at 2.2 GHz, cpu4-7 Cortex-A72 at 2.3 GHz; no list files, so
    // the cpuN directories are the CPU list.
    let tmp = TempDir::new("rk3576");
    let freqs: Vec<_> = (0..8)
        .map(|i| (i, Some(if i < 4 { 2_208_000 } else { 2_304_000 })))
        .collect();
    fake_sysfs(&tmp.0, None, &freqs);
    let topo = CpuTopology::from_sysfs(&tmp.0).unwrap();
    assert_eq!(topo.cpus.len(), 8);
    assert_eq!(topo.big_cores(), [4, 5, 6, 7]);
    assert_eq!(topo.little_cores(), [0, 1, 2, 3]);
    assert!(topo.is_heterogeneous());
}

#[test]
fn unreadable_sysfs_is_an_error_and_detect_never_fails() {
    let tmp = TempDir::new("empty");
    assert!(CpuTopology::from_sysfs(&tmp.0).is_err());
    fake_sysfs(&tmp.0, Some(("possible", "garbage")), &[]);
    assert!(CpuTopology::from_sysfs(&tmp.0).is_err());

    let topo = CpuTopology::detect();
    assert!(!topo.cpus.is_empty());
    assert!(!topo.big_cores().is_empty());
    let mut all: Vec<_> = topo.big_cores();
    all.extend(topo.little_cores());
    all.sort_unstable();
    let ids: Vec<_> = topo.cpus.iter().map(|c| c.id).collect();
    assert_eq!(all, ids, "big and little partition the CPUs");
}

#[test]
fn empty_cpu_list_pins_nothing() {
    let topo = CpuTopology { cpus: vec![] };
    assert_eq!(Pinning::Cpus(vec![]).cpus(&topo), None);
    assert!(pin_current_thread(&[]).is_err());
    assert!(pin_current_thread(&[1 << 20]).is_err());
}

/// The CPUs this thread may run on.
#[cfg(target_os = "linux")]
fn current_affinity() -> Vec<usize> {
    // SAFETY: an all-zero `cpu_set_t` is the empty set; `sched_getaffinity` fills it and
    // `CPU_ISSET` reads bits below its capacity.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let rc = libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set);
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        (0..8 * std::mem::size_of_val(&set))
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

#[cfg(target_os = "linux")]
#[test]
fn pinning_the_current_thread_restricts_its_affinity() {
    // A thread of its own, so the pin cannot leak into other tests.
    std::thread::spawn(|| {
        let allowed = current_affinity();
        assert!(!allowed.is_empty());
        // CPU 0 when this process may use it (the usual case), else its first CPU.
        let cpu = allowed[0];
        pin_current_thread(&[cpu]).unwrap();
        assert_eq!(current_affinity(), [cpu]);
        pin_current_thread(&allowed).unwrap();
        assert_eq!(current_affinity(), allowed);
    })
    .join()
    .unwrap();
}
