//! Host CPU topology (which cores are the fast ones) and thread pinning.
//!
//! The NPU is fed by host threads that quantise, pack and collect (see
//! [`glue`](super::glue)); on a big.LITTLE SoC those threads belong on the big cores. The
//! topology is read from sysfs: the CPUs listed in `/sys/devices/system/cpu/online` (or
//! `possible`, or the `cpuN` directories) and each one's `cpufreq/cpuinfo_max_freq`. The big
//! cores are those with the highest maximum frequency.

use std::io;
use std::path::Path;

/// One logical CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuInfo {
    /// The kernel's CPU number (the `N` of `cpuN`, and the bit of an affinity mask).
    pub id: usize,
    /// `cpuinfo_max_freq` in kHz; `None` if cpufreq does not report it.
    pub max_freq_khz: Option<u64>,
}

/// The logical CPUs of the host, in increasing `id` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuTopology {
    /// Every CPU found.
    pub cpus: Vec<CpuInfo>,
}

impl CpuTopology {
    /// The topology of this machine, from `/sys`. Never fails: without a readable sysfs it is
    /// `std::thread::available_parallelism()` CPUs numbered from 0, with unknown frequencies
    /// (which makes the topology homogeneous, so nothing gets pinned).
    pub fn detect() -> CpuTopology {
        match CpuTopology::from_sysfs(Path::new("/")) {
            Ok(topo) if !topo.cpus.is_empty() => topo,
            _ => {
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                CpuTopology {
                    cpus: (0..n)
                        .map(|id| CpuInfo {
                            id,
                            max_freq_khz: None,
                        })
                        .collect(),
                }
            }
        }
    }

    /// Reads the topology of the sysfs tree under `root` (`/` for this machine; tests pass a
    /// fake tree): CPUs from `root/sys/devices/system/cpu/online`, else `possible` (format
    /// `0-3,6`), else the `cpuN` directories; frequencies from
    /// `cpuN/cpufreq/cpuinfo_max_freq` (a missing, unparsable or zero value is `None`).
    ///
    /// # Errors
    ///
    /// If no CPU list can be read: neither list file parses and the directory cannot be read
    /// or holds no `cpuN` entry.
    pub fn from_sysfs(root: &Path) -> io::Result<CpuTopology> {
        let base = root.join("sys/devices/system/cpu");
        let listed = ["online", "possible"].iter().find_map(|file| {
            let text = std::fs::read_to_string(base.join(file)).ok()?;
            parse_cpu_list(&text).filter(|ids| !ids.is_empty())
        });
        let mut ids = match listed {
            Some(ids) => ids,
            None => {
                let mut ids = Vec::new();
                for entry in std::fs::read_dir(&base)? {
                    let name = entry?.file_name();
                    let id = name
                        .to_str()
                        .and_then(|n| n.strip_prefix("cpu"))
                        .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                        .and_then(|d| d.parse::<usize>().ok());
                    ids.extend(id);
                }
                if ids.is_empty() {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("no CPU list or cpuN directory under {}", base.display()),
                    ));
                }
                ids
            }
        };
        ids.sort_unstable();
        ids.dedup();
        let cpus = ids
            .into_iter()
            .map(|id| CpuInfo {
                id,
                max_freq_khz: std::fs::read_to_string(
                    base.join(format!("cpu{id}/cpufreq/cpuinfo_max_freq")),
                )
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .filter(|&f| f > 0),
            })
            .collect();
        Ok(CpuTopology { cpus })
    }

    /// The highest known maximum frequency, if any CPU reports one.
    fn top_freq(&self) -> Option<u64> {
        self.cpus.iter().filter_map(|c| c.max_freq_khz).max()
    }

    /// The ids of the CPUs with the highest maximum frequency. If no frequency is known, or all
    /// are equal, that is every CPU. (A CPU whose frequency is unknown while others report one
    /// is not counted as big.)
    pub fn big_cores(&self) -> Vec<usize> {
        let top = self.top_freq();
        self.cpus
            .iter()
            .filter(|c| top.is_none() || c.max_freq_khz == top)
            .map(|c| c.id)
            .collect()
    }

    /// The ids of the CPUs not in [`big_cores`](Self::big_cores).
    pub fn little_cores(&self) -> Vec<usize> {
        let top = self.top_freq();
        self.cpus
            .iter()
            .filter(|c| top.is_some() && c.max_freq_khz != top)
            .map(|c| c.id)
            .collect()
    }

    /// Whether some CPUs are slower than others (there are little cores).
    pub fn is_heterogeneous(&self) -> bool {
        !self.little_cores().is_empty()
    }
}

/// Parses a kernel CPU list such as `0-3,6,8-9\n`; `None` if malformed.
fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let text = text.trim();
    let mut ids = Vec::new();
    if text.is_empty() {
        return Some(ids);
    }
    for part in text.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi): (usize, usize) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
                // A real list never spans more than a few thousand CPUs; this bounds a
                // corrupt file's allocation.
                if lo > hi || hi - lo > 1 << 16 {
                    return None;
                }
                ids.extend(lo..=hi);
            }
            None => ids.push(part.parse().ok()?),
        }
    }
    Some(ids)
}

/// Where the engine's host threads run.
///
/// On RK3588, cpu0-3 are Cortex-A55 (1.8 GHz) and cpu4-7 Cortex-A76 (2.3 GHz). Pinning the
/// host threads to the A76s measured +18.9% prefill and +12.8% decode throughput in the field,
/// and 8 threads (spreading onto the A55s) were slower than 4, so the default is
/// [`BigCores`](Pinning::BigCores).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Pinning {
    /// The CPUs with the highest maximum frequency ([`CpuTopology::big_cores`]); no pinning on
    /// a homogeneous machine.
    #[default]
    BigCores,
    /// These CPU ids.
    Cpus(Vec<usize>),
    /// Leave the threads where the OS puts them.
    None,
}

impl Pinning {
    /// The CPUs to pin to on `topo`, or `None` for "do not pin".
    ///
    /// `BigCores` on a homogeneous topology is `None`: pinning to every CPU would change
    /// nothing but would override an affinity mask the user set (`taskset`). An empty
    /// `Cpus` list is `None` too, since no thread can run on no CPU.
    pub fn cpus(&self, topo: &CpuTopology) -> Option<Vec<usize>> {
        match self {
            Pinning::BigCores => topo.is_heterogeneous().then(|| topo.big_cores()),
            Pinning::Cpus(ids) => (!ids.is_empty()).then(|| ids.clone()),
            Pinning::None => None,
        }
    }
}

/// Restricts the calling thread to `cpus` (`sched_setaffinity(0, ...)`).
///
/// # Errors
///
/// `InvalidInput` for an empty list or an id beyond the affinity mask (`CPU_SETSIZE`); the OS
/// error if the kernel refuses (e.g. none of the CPUs is allowed in this cpuset);
/// `Unsupported` on systems other than Linux and Android.
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        if cpus.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot pin a thread to an empty CPU set",
            ));
        }
        // SAFETY: `cpu_set_t` is a plain bit array, for which all-zero is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let capacity = 8 * std::mem::size_of::<libc::cpu_set_t>();
        for &cpu in cpus {
            if cpu >= capacity {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("CPU {cpu} is beyond the affinity mask ({capacity} CPUs)"),
                ));
            }
            // SAFETY: `cpu` is below the set's capacity (checked above).
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        // SAFETY: `set` is a valid, initialised mask of the size passed; pid 0 is this thread.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = cpus;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "thread pinning is implemented for Linux and Android only",
        ))
    }
}
