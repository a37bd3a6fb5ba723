//! NPU memories: the `rknn_tensor_mem` structs handed to C, their buffers, and the accounting
//! that reproduces the device's limits (handle budget, 4 GiB per IOMMU domain).

use std::collections::HashMap;

use rknn_sys as sys;

/// A 64-byte aligned, zeroed chunk: buffers are made of these so that SIMD code and DMA-style
/// alignment assumptions hold, as they do for the runtime's page-aligned dma-bufs.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Chunk([u8; 64]);

/// An owned byte buffer at a stable address, freed on drop.
struct Buffer {
    ptr: *mut Chunk,
    chunks: usize,
}

impl Buffer {
    fn zeroed(bytes: usize) -> Buffer {
        let chunks = bytes.div_ceil(64).max(1);
        let boxed: Box<[Chunk]> = vec![Chunk([0; 64]); chunks].into_boxed_slice();
        Buffer {
            ptr: Box::into_raw(boxed).cast::<Chunk>(),
            chunks,
        }
    }

    fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.cast::<u8>()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `chunks` came from `Box::into_raw` of a `Box<[Chunk]>` of exactly that
        // length in `zeroed`, and are dropped once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.chunks)) });
    }
}

/// What the emulator knows about one live memory.
pub(crate) struct Memory {
    /// The struct handed to C; freed when the memory is destroyed.
    desc: *mut sys::rknn_tensor_mem,
    /// The CPU view, when the runtime allocated the memory (None for wrapped fd/phys memory).
    cpu: Option<Buffer>,
    /// The device view under strict cache emulation.
    device: Option<Buffer>,
    /// Unique over the process's life (a new memory may reuse a destroyed one's address).
    pub(crate) id: u64,
    /// The context the memory was created on (0 for `ALLOC_NO_CONTEXT`).
    pub(crate) ctx: u64,
    /// The IOMMU domain charged.
    pub(crate) domain: i32,
    /// Bytes charged.
    pub(crate) size: usize,
    /// Where the data starts for the CPU (virt_addr + offset).
    data: *mut u8,
}

// SAFETY: the raw pointers are owned allocations (or caller-owned memory that the C contract
// keeps alive while the memory exists); access is serialised by the instance's mutex.
unsafe impl Send for Memory {}

impl Memory {
    /// The bytes the device reads and writes: the device copy under strict cache emulation,
    /// otherwise the CPU bytes.
    pub(crate) fn device_ptr(&self) -> *mut u8 {
        self.device.as_ref().map_or(self.data, Buffer::as_mut_ptr)
    }

    /// Copies between the CPU and device views (strict cache emulation only).
    pub(crate) fn sync(&self, to_device: bool, from_device: bool) {
        if let Some(dev) = &self.device {
            let (cpu, dev) = (self.data, dev.as_mut_ptr());
            if to_device {
                // SAFETY: both buffers are at least `size` bytes and distinct allocations.
                unsafe { std::ptr::copy_nonoverlapping(cpu, dev, self.size) };
            }
            if from_device {
                // SAFETY: as above.
                unsafe { std::ptr::copy_nonoverlapping(dev, cpu, self.size) };
            }
        }
    }
}

/// Why an allocation failed; each maps to a NULL return and a diagnostic.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AllocError {
    Budget { live: usize },
    Domain { domain: i32, used: u64, limit: u64 },
    Size,
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
            AllocError::Size => f.write_str("size 0 or beyond the address space"),
        }
    }
}

/// All live memories of one emulator instance.
#[derive(Default)]
pub(crate) struct Memories {
    live: HashMap<usize, Memory>,
    domain_bytes: HashMap<i32, u64>,
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
        cfg: &crate::EmuConfig,
        ctx: u64,
        domain: i32,
        size: u64,
        source: Source,
        next_fd: &mut i32,
    ) -> Result<*mut sys::rknn_tensor_mem, AllocError> {
        let size32 = u32::try_from(size)
            .ok()
            .filter(|&s| s > 0)
            .ok_or(AllocError::Size)?;
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
                let cpu = Buffer::zeroed(size);
                let device = cfg.strict_cache.then(|| Buffer::zeroed(size));
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
                cpu,
                device,
                id: crate::instance::next_handle(),
                ctx,
                domain,
                size,
                data,
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
        if m.cpu.is_some() {
            if let Some(used) = self.domain_bytes.get_mut(&m.domain) {
                *used -= m.size as u64;
            }
        }
        // SAFETY: `desc` came from `Box::into_raw` in `create` and is freed once, here.
        drop(unsafe { Box::from_raw(m.desc) });
        drop(m.cpu);
        drop(m.device);
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
