//! NPU memories: the `rknn_tensor_mem` structs handed to C, their buffers, and the accounting
//! that reproduces the device's limits (handle budget, 4 GiB per IOMMU domain).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use rknn_sys as sys;
use rustc_hash::FxHashMap;

/// An owned, zeroed byte buffer at a stable address, freed on drop: the CPU (or device) view
/// of one emulated DMA memory.
///
/// On a board every NPU memory is a dma-buf with its own page-aligned mapping, so a C program
/// that runs past the end of one faults instead of scribbling over the runtime's heap. The
/// emulator gives each buffer the same: its own anonymous mapping, rounded up to whole pages,
/// followed by one `PROT_NONE` guard page. An overrun within the last page's rounding goes
/// unnoticed, as on a board; one that reaches the next page is a SIGSEGV at the faulting write.
///
/// Under Miri (no `mmap`/`mprotect`) and on non-Unix targets it is a 64-byte aligned heap
/// allocation instead, with no guard.
struct Buffer {
    ptr: std::ptr::NonNull<u8>,
    /// Bytes of the whole mapping (data pages and guard page), or of the heap allocation.
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; it has no thread affinity.
unsafe impl Send for Buffer {}

#[cfg(all(unix, not(miri)))]
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

impl Buffer {
    /// A zeroed buffer of at least `bytes` bytes, or the reason the host could not provide it.
    #[cfg(all(unix, not(miri)))]
    fn zeroed(bytes: usize) -> Result<Buffer, AllocError> {
        let page = page_size();
        let oom = |errno: Option<i32>| AllocError::OutOfMemory { bytes, errno };
        let data = bytes
            .max(1)
            .div_ceil(page)
            .checked_mul(page)
            .ok_or(oom(Some(libc::ENOMEM)))?;
        let len = data.checked_add(page).ok_or(oom(Some(libc::ENOMEM)))?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(oom(std::io::Error::last_os_error().raw_os_error()));
        }
        // From here the mapping is owned by `buf`, unmapped on every path.
        let buf = Buffer {
            ptr: std::ptr::NonNull::new(p.cast::<u8>()).ok_or(oom(Some(libc::ENOMEM)))?,
            len,
        };
        // SAFETY: the last page lies inside the mapping just created; nothing else uses it.
        let rc = unsafe { libc::mprotect(p.cast::<u8>().add(data).cast(), page, libc::PROT_NONE) };
        if rc != 0 {
            return Err(oom(std::io::Error::last_os_error().raw_os_error()));
        }
        Ok(buf)
    }

    #[cfg(any(not(unix), miri))]
    fn zeroed(bytes: usize) -> Result<Buffer, AllocError> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), 64)
            .map_err(|_| AllocError::OutOfMemory { bytes, errno: None })?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(p).ok_or(AllocError::OutOfMemory { bytes, errno: None })?;
        Ok(Buffer {
            ptr,
            len: layout.size(),
        })
    }

    fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        #[cfg(all(unix, not(miri)))]
        {
            // SAFETY: `ptr` and `len` are exactly the mapping made in `zeroed`, unmapped once.
            // A failure cannot be handled here; it would only leak the mapping.
            let _ = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
        #[cfg(any(not(unix), miri))]
        {
            let layout = std::alloc::Layout::from_size_align(self.len, 64)
                .expect("the layout was valid when the buffer was allocated");
            // SAFETY: allocated in `zeroed` with this layout, freed once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// The bytes of one memory: its mappings and the device's view of them. The registry holds
/// one reference and each context that binds the memory another, so a context reads the
/// memory at run time without the instance's lock, and a memory destroyed during a run stays
/// mapped until the run ends (the run after it fails, as the board would fault).
pub(crate) struct Shared {
    /// The CPU view, when the runtime allocated the memory (None for wrapped fd/phys memory).
    cpu: Option<Buffer>,
    /// The device view under strict cache emulation.
    device: Option<Buffer>,
    /// Where the data starts for the CPU (virt_addr + offset).
    data: *mut u8,
    /// Bytes of the memory.
    size: usize,
    /// Orders the emulator's own accesses to the device view: runs read A and B and write C,
    /// syncs copy between the views. (The CPU view belongs to the C program, which writes it
    /// through `virt_addr` whenever it likes, as on a board.)
    lock: RwLock<()>,
    /// Set by `rknn_destroy_mem`: a context bound to it fails its next run.
    destroyed: AtomicBool,
}

// SAFETY: the pointers are owned mappings (or caller memory that the C contract keeps alive
// while the memory exists); the emulator's accesses to the device view go through `lock`.
unsafe impl Send for Shared {}
// SAFETY: as above; shared references only read the pointers and take the lock.
unsafe impl Sync for Shared {}

impl Shared {
    /// The bytes the device reads and writes: the device copy under strict cache emulation,
    /// otherwise the CPU bytes.
    fn device_ptr(&self) -> *mut u8 {
        self.device.as_ref().map_or(self.data, Buffer::as_mut_ptr)
    }

    /// Whether `rknn_destroy_mem` was called on it.
    pub(crate) fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }

    /// The device view for reading, while the returned guard lives.
    pub(crate) fn read(&self) -> DeviceRead<'_> {
        DeviceRead {
            _guard: self.lock.read().unwrap_or_else(PoisonError::into_inner),
            shared: self,
        }
    }

    /// The device view for writing, while the returned guard lives.
    pub(crate) fn write(&self) -> DeviceWrite<'_> {
        DeviceWrite {
            _guard: self.lock.write().unwrap_or_else(PoisonError::into_inner),
            shared: self,
        }
    }

    /// Copies between the CPU and device views (strict cache emulation only), excluding runs
    /// and other syncs of this memory meanwhile (two syncs from the device both write the CPU
    /// view).
    pub(crate) fn sync(&self, to_device: bool, from_device: bool) {
        if let Some(dev) = &self.device {
            let (cpu, dev) = (self.data, dev.as_mut_ptr());
            let _w = self.lock.write().unwrap_or_else(PoisonError::into_inner);
            if to_device {
                // SAFETY: both buffers are at least `size` bytes and distinct allocations; the
                // write lock keeps the emulator's other accesses off both meanwhile.
                unsafe { std::ptr::copy_nonoverlapping(cpu, dev, self.size) };
            }
            if from_device {
                // SAFETY: as above.
                unsafe { std::ptr::copy_nonoverlapping(dev, cpu, self.size) };
            }
        }
    }
}

/// The device view of a memory, read-locked.
pub(crate) struct DeviceRead<'a> {
    _guard: RwLockReadGuard<'a, ()>,
    shared: &'a Shared,
}

impl DeviceRead<'_> {
    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping holds `size` bytes and lives as long as `shared` (owned, or kept
        // alive by the C contract for wrapped memory); the emulator does not write it while
        // the read lock is held.
        unsafe { std::slice::from_raw_parts(self.shared.device_ptr(), self.shared.size) }
    }
}

/// The device view of a memory, write-locked.
pub(crate) struct DeviceWrite<'a> {
    _guard: RwLockWriteGuard<'a, ()>,
    shared: &'a Shared,
}

impl DeviceWrite<'_> {
    /// The bytes.
    pub(crate) fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: as in `DeviceRead::bytes`; the write lock excludes every other access of the
        // emulator, and `&mut self` this guard's other views.
        unsafe { std::slice::from_raw_parts_mut(self.shared.device_ptr(), self.shared.size) }
    }
}

/// What the emulator knows about one live memory.
pub(crate) struct Memory {
    /// The struct handed to C; freed when the memory is destroyed.
    desc: *mut sys::rknn_tensor_mem,
    /// The bytes, shared with the contexts it is bound to.
    pub(crate) shared: Arc<Shared>,
    /// The context the memory was created on (0 for `ALLOC_NO_CONTEXT`).
    pub(crate) ctx: u64,
    /// The IOMMU domain charged.
    pub(crate) domain: i32,
    /// Bytes charged.
    pub(crate) size: usize,
}

// SAFETY: `desc` is an owned allocation, created in `Memories::create` and freed in
// `Memories::destroy`, both through `&mut` (the instance's write lock).
unsafe impl Send for Memory {}
// SAFETY: through `&Memory` (the instance's read lock) `desc` is only compared as a key, never
// dereferenced; the bytes are behind `Shared`, which is `Sync` itself.
unsafe impl Sync for Memory {}

/// Why an allocation failed; each maps to a NULL return and a diagnostic.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AllocError {
    Budget { live: usize },
    Domain { domain: i32, used: u64, limit: u64 },
    Size { size: u64 },
    OutOfMemory { bytes: usize, errno: Option<i32> },
}

impl std::fmt::Display for AllocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AllocError::Budget { live } => write!(
                f,
                "{live} memories are live: out of dma-buf handles (the real process fails with \
                 errno 24, too many open files, near 1020 under ulimit -n 1024)"
            ),
            AllocError::Domain {
                domain,
                used,
                limit,
            } => {
                write!(
                    f,
                    "IOMMU domain {domain} is full ({used} of {limit} bytes in use)"
                )
            }
            AllocError::Size { size } => write!(
                f,
                "size {size} is 0 or above {} (rknn_tensor_mem.size is a uint32_t)",
                u32::MAX
            ),
            AllocError::OutOfMemory { bytes, errno } => {
                write!(f, "the host could not map {bytes} bytes")?;
                if let Some(e) = errno {
                    write!(f, " ({})", std::io::Error::from_raw_os_error(*e))?;
                }
                f.write_str(": out of memory, as a board runs out of DMA memory")
            }
        }
    }
}

/// All live memories of one emulator instance.
#[derive(Default)]
pub(crate) struct Memories {
    live: FxHashMap<usize, Memory>,
    domain_bytes: FxHashMap<i32, u64>,
}

/// The registry key of a memory: its address. Pointers from C are only ever compared with
/// keys, never turned back into pointers (the stored `desc` keeps the provenance).
pub(crate) fn key(mem: *const sys::rknn_tensor_mem) -> usize {
    mem.addr()
}

/// Where a new memory's bytes come from.
pub(crate) enum Source {
    /// The runtime allocates (`rknn_create_mem`, `rknn_create_mem2`).
    Alloc,
    /// Caller memory wrapped by `rknn_create_mem_from_fd` / `_from_phys`.
    Wrap {
        fd: i32,
        phys: u64,
        virt: *mut u8,
        offset: i32,
        flags: u32,
    },
}

impl Memories {
    pub(crate) fn len(&self) -> usize {
        self.live.len()
    }

    /// Creates a memory and returns the struct pointer handed to C.
    pub(crate) fn create(
        &mut self,
        cfg: &crate::config::EmuConfig,
        ctx: u64,
        domain: i32,
        size: u64,
        source: Source,
        next_fd: &mut i32,
    ) -> Result<*mut sys::rknn_tensor_mem, AllocError> {
        let size32 = u32::try_from(size)
            .ok()
            .filter(|&s| s > 0)
            .ok_or(AllocError::Size { size })?;
        let size = size32 as usize;
        if self.live.len() >= cfg.handle_budget {
            return Err(AllocError::Budget {
                live: self.live.len(),
            });
        }
        let mut desc = sys::rknn_tensor_mem {
            size: size32,
            ..Default::default()
        };
        let (cpu, device, data) = match source {
            Source::Alloc => {
                let used = self.domain_bytes.get(&domain).copied().unwrap_or(0);
                if used + size as u64 > cfg.iommu_domain_bytes {
                    return Err(AllocError::Domain {
                        domain,
                        used,
                        limit: cfg.iommu_domain_bytes,
                    });
                }
                let cpu = Buffer::zeroed(size)?;
                let device = match cfg.strict_cache {
                    true => Some(Buffer::zeroed(size)?),
                    false => None,
                };
                *next_fd += 1;
                desc.fd = *next_fd;
                desc.flags = sys::RKNN_TENSOR_MEMORY_FLAGS_ALLOC_INSIDE;
                desc.virt_addr = cpu.as_mut_ptr().cast();
                // A fake but stable device address, page aligned like the real IOMMU's.
                desc.phys_addr = 0x1_0000_0000 + (*next_fd as u64) * 0x10_0000;
                let data = cpu.as_mut_ptr();
                (Some(cpu), device, data)
            }
            Source::Wrap {
                fd,
                phys,
                virt,
                offset,
                flags,
            } => {
                desc.fd = fd;
                desc.phys_addr = phys;
                desc.offset = offset;
                desc.flags = flags;
                desc.virt_addr = virt.cast();
                // Data starts `offset` bytes into the caller's mapping.
                (None, None, virt.wrapping_add(offset.max(0) as usize))
            }
        };
        let charged = cpu.is_some();
        let shared = Arc::new(Shared {
            cpu,
            device,
            data,
            size,
            lock: RwLock::new(()),
            destroyed: AtomicBool::new(false),
        });
        let desc = Box::into_raw(Box::new(desc));
        // SAFETY: `desc` was just created from a Box and is valid.
        unsafe { (*desc).priv_data = desc.cast() };
        if charged {
            *self.domain_bytes.entry(domain).or_insert(0) += size as u64;
        }
        self.live.insert(
            key(desc),
            Memory {
                desc,
                shared,
                ctx,
                domain,
                size,
            },
        );
        Ok(desc)
    }

    /// The live memory behind a pointer handed out by `create`.
    pub(crate) fn get(&self, mem: *const sys::rknn_tensor_mem) -> Option<&Memory> {
        self.get_key(key(mem))
    }

    /// The live memory with this key (see [`key`]).
    pub(crate) fn get_key(&self, k: usize) -> Option<&Memory> {
        self.live.get(&k)
    }

    /// Destroys a memory. `None` if the pointer is not a live memory of this instance.
    pub(crate) fn destroy(&mut self, mem: *mut sys::rknn_tensor_mem) -> Option<()> {
        self.destroy_key(key(mem))
    }

    fn destroy_key(&mut self, k: usize) -> Option<()> {
        let m = self.live.remove(&k)?;
        m.shared.destroyed.store(true, Ordering::Release);
        if m.shared.cpu.is_some() {
            if let Some(used) = self.domain_bytes.get_mut(&m.domain) {
                *used -= m.size as u64;
            }
        }
        // SAFETY: `desc` came from `Box::into_raw` in `create` and is freed once, here.
        drop(unsafe { Box::from_raw(m.desc) });
        // The mappings go with the last context that still holds them.
        drop(m.shared);
        Some(())
    }

    /// Memories created on `ctx`.
    pub(crate) fn count_for_ctx(&self, ctx: u64) -> usize {
        self.live.values().filter(|m| m.ctx == ctx).count()
    }

    /// Bytes in use in an IOMMU domain.
    pub(crate) fn domain_used(&self, domain: i32) -> u64 {
        self.domain_bytes.get(&domain).copied().unwrap_or(0)
    }
}

impl Drop for Memories {
    fn drop(&mut self) {
        let keys: Vec<usize> = self.live.keys().copied().collect();
        for k in keys {
            self.destroy_key(k);
        }
    }
}
