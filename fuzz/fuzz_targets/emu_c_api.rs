//! The emulator's C entry points with random arguments, in random order: handles that are
//! live, destroyed or made up; memories that are live, freed or arbitrary addresses; NULL
//! pointers; dimensions, types, layouts, masks, modes and sizes from the whole range of their
//! C types. Pointers that the C contract says must be valid are valid (a buffer of the length
//! the call is told); everything else is random.
//!
//! Checked: every call returns 0 or one of the runtime's documented error codes (never a crash
//! or a sanitizer report); `rknn_matmul_destroy` and `rknn_destroy_mem` succeed exactly for
//! live handles (a model of the live set is kept); the emulator's counters match that model
//! after every call.
#![no_main]

use std::ffi::c_void;
use std::ptr::null_mut;

use libfuzzer_sys::fuzz_target;
use rknn_emu::{EmuConfig, Emulator};
use rknn_sys::{self as sys, rknn_matmul_ctx, rknn_tensor_mem};

/// The fuzz input as a stream of choices (zeros once it is exhausted).
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.u8() as usize % from.len()]
    }
    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// Dimensions worth trying: the rules' edges and the C type's.
const DIMS: [i32; 16] = [
    1,
    2,
    7,
    16,
    31,
    32,
    33,
    64,
    96,
    128,
    4096,
    0,
    -1,
    -32,
    i32::MAX,
    i32::MIN,
];
const TYPES: [u32; 14] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 12, u32::MAX];
const LAYOUTS: [i16; 5] = [0, 1, 2, 3, -1];

fn codes() -> [i32; 14] {
    [
        0,
        sys::RKNN_ERR_FAIL,
        sys::RKNN_ERR_TIMEOUT,
        sys::RKNN_ERR_DEVICE_UNAVAILABLE,
        sys::RKNN_ERR_MALLOC_FAIL,
        sys::RKNN_ERR_PARAM_INVALID,
        sys::RKNN_ERR_MODEL_INVALID,
        sys::RKNN_ERR_CTX_INVALID,
        sys::RKNN_ERR_INPUT_INVALID,
        sys::RKNN_ERR_OUTPUT_INVALID,
        sys::RKNN_ERR_DEVICE_UNMATCH,
        sys::RKNN_ERR_INCOMPATILE_PRE_COMPILE_MODEL,
        sys::RKNN_ERR_INCOMPATILE_OPTIMIZATION_LEVEL_VERSION,
        sys::RKNN_ERR_TARGET_PLATFORM_UNMATCH,
    ]
}

struct Ctx {
    handle: rknn_matmul_ctx,
    /// Every shape's io_attr (one for a static context).
    io: Vec<sys::rknn_matmul_io_attr>,
}

struct Mem {
    ptr: *mut rknn_tensor_mem,
    owner: rknn_matmul_ctx,
    size: u32,
    /// The CPU mapping is the emulator's (writable by us), not a wrapped buffer.
    inside: bool,
}

fn info(inp: &mut Input) -> sys::rknn_matmul_info {
    sys::rknn_matmul_info {
        M: inp.pick(&DIMS),
        K: inp.pick(&DIMS),
        N: inp.pick(&DIMS),
        type_: inp.pick(&TYPES),
        B_layout: inp.pick(&LAYOUTS),
        AC_layout: inp.pick(&LAYOUTS),
        B_quant_type: inp.pick(&[0, 1, 2, 3, -1]),
        AC_quant_type: inp.pick(&[0, 1, 2, -1]),
        iommu_domain_id: inp.pick(&[0, 0, 0, 1, -1, i32::MAX]),
        group_size: inp.pick(&[0, 32, 64, 7, -1, i16::MAX]),
        ..Default::default()
    }
}

fn name(s: &str) -> [std::ffi::c_char; 256] {
    let mut n = [0; 256];
    for (d, b) in n.iter_mut().zip(s.bytes()) {
        *d = b as std::ffi::c_char;
    }
    n
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let platform = inp.pick(&rknn_emu::rknn_chip::Platform::ALL);
    let cfg = EmuConfig {
        handle_budget: 8,
        strict_cache: inp.bool(),
        log_errors: false,
        ..EmuConfig::new(platform)
    };
    let Ok(emu) = Emulator::new(cfg) else {
        return;
    };
    let api = emu.api();
    let known = codes();
    let mut ctxs: Vec<Ctx> = Vec::new();
    let mut dead_ctxs: Vec<rknn_matmul_ctx> = vec![0, 1, u64::MAX as rknn_matmul_ctx];
    let mut mems: Vec<Mem> = Vec::new();
    let mut dead_mems: Vec<*mut rknn_tensor_mem> =
        vec![null_mut(), 8 as *mut _, usize::MAX as *mut _];
    // Caller memory wrapped by create_mem_from_fd/phys: must outlive the emulator's use.
    let mut wrapped: Vec<Vec<u8>> = Vec::new();
    let mut ops = 0;
    while !inp.done() && ops < 64 {
        ops += 1;
        let any_ctx = |inp: &mut Input, ctxs: &[Ctx], dead: &[rknn_matmul_ctx]| {
            if !ctxs.is_empty() && inp.u8() % 4 != 0 {
                ctxs[inp.u8() as usize % ctxs.len()].handle
            } else {
                dead[inp.u8() as usize % dead.len()]
            }
        };
        let any_mem = |inp: &mut Input, mems: &[Mem], dead: &[*mut rknn_tensor_mem]| {
            if !mems.is_empty() && inp.u8() % 4 != 0 {
                mems[inp.u8() as usize % mems.len()].ptr
            } else {
                dead[inp.u8() as usize % dead.len()]
            }
        };
        let op = inp.u8() % 18;
        let rc: i32 = match op {
            0 => {
                let mut i = info(&mut inp);
                let mut io = sys::rknn_matmul_io_attr::default();
                let mut ctx: rknn_matmul_ctx = 0;
                let nulls = inp.u8() % 8;
                let p_ctx = if nulls == 1 {
                    null_mut()
                } else {
                    &mut ctx as *mut _
                };
                let p_io = if nulls == 2 {
                    null_mut()
                } else {
                    &mut io as *mut _
                };
                // SAFETY: valid pointers or NULL, as the C contract allows the caller to pass.
                let rc = unsafe { (api.rknn_matmul_create)(p_ctx, &mut i, p_io) };
                if rc == 0 {
                    ctxs.push(Ctx {
                        handle: ctx,
                        io: vec![io],
                    });
                }
                rc
            }
            1 => {
                let mut i = info(&mut inp);
                let num: i32 = inp.pick(&[1, 2, 3, 4, 0, -1, 513]);
                let len = usize::try_from(num).unwrap_or(0).max(1);
                let mut shapes: Vec<sys::rknn_matmul_shape> = (0..len)
                    .map(|_| sys::rknn_matmul_shape {
                        M: inp.pick(&DIMS),
                        K: i.K,
                        N: if inp.u8() % 8 == 0 {
                            inp.pick(&DIMS)
                        } else {
                            i.N
                        },
                    })
                    .collect();
                let mut ios = vec![sys::rknn_matmul_io_attr::default(); len];
                let mut ctx: rknn_matmul_ctx = 0;
                let f = api
                    .rknn_matmul_create_dynamic_shape
                    .expect("the emulator has it");
                // SAFETY: buffers of `len >= num` entries.
                let rc = unsafe { f(&mut ctx, &mut i, num, shapes.as_mut_ptr(), ios.as_mut_ptr()) };
                if rc == 0 {
                    ios.truncate(num as usize);
                    ctxs.push(Ctx {
                        handle: ctx,
                        io: ios,
                    });
                }
                rc
            }
            2 => {
                let ctx = any_ctx(&mut inp, &ctxs, &dead_ctxs);
                let mut s = sys::rknn_matmul_shape {
                    M: inp.pick(&DIMS),
                    K: inp.pick(&DIMS),
                    N: inp.pick(&DIMS),
                };
                let f = api
                    .rknn_matmul_set_dynamic_shape
                    .expect("the emulator has it");
                let p = if inp.u8() % 8 == 0 {
                    null_mut()
                } else {
                    &mut s as *mut _
                };
                // SAFETY: a valid shape or NULL.
                unsafe { f(ctx, p) }
            }
            3 => {
                let ctx = any_ctx(&mut inp, &ctxs, &dead_ctxs);
                let mem = any_mem(&mut inp, &mems, &dead_mems);
                let mut attr = match ctxs.iter().find(|c| c.handle == ctx) {
                    Some(c) => {
                        let io = &c.io[inp.u8() as usize % c.io.len()];
                        *[&io.A, &io.B, &io.C][inp.u8() as usize % 3]
                    }
                    None => sys::rknn_matmul_tensor_attr {
                        name: name(inp.pick(&["A", "B", "C"])),
                        size: inp.u32() % 4096,
                        ..Default::default()
                    },
                };
                match inp.u8() % 6 {
                    0 => attr.size = inp.u32(),
                    1 => attr.name = name(inp.pick(&["D", "", "AA", "a"])),
                    _ => {}
                }
                let p = if inp.u8() % 16 == 0 {
                    null_mut()
                } else {
                    &mut attr as *mut _
                };
                // SAFETY: `attr` is valid; `mem` is compared with the emulator's keys, never
                // dereferenced unless it is one of its live memories.
                unsafe { (api.rknn_matmul_set_io_mem)(ctx, mem, p) }
            }
            4 => {
                let ctx = any_ctx(&mut inp, &ctxs, &dead_ctxs);
                let mask = inp.pick(&[0, 1, 2, 4, 3, 7, 8, 0xFFFF, 0x10000, u32::MAX]);
                if inp.bool() {
                    // SAFETY: plain values.
                    unsafe { (api.rknn_matmul_set_core_mask)(ctx, mask) }
                } else {
                    let f = api.rknn_set_core_mask.expect("the emulator has it");
                    // SAFETY: plain values.
                    unsafe { f(ctx, mask) }
                }
            }
            5 => {
                let ctx = any_ctx(&mut inp, &ctxs, &dead_ctxs);
                let scale_len: i32 = inp.pick(&[0, 1, 2, 32, 64, -1, 100]);
                let zp_len: i32 = inp.pick(&[0, 1, 32, -1]);
                let mut scales: Vec<f32> = (0..scale_len.max(0))
                    .map(|_| inp.pick(&[1.0, 0.5, 0.0, -1.0, f32::NAN, f32::INFINITY, 1e-30]))
                    .collect();
                let mut zps: Vec<i32> = (0..zp_len.max(0))
                    .map(|_| inp.pick(&[0, 1, -128, 127, i32::MAX]))
                    .collect();
                let mut p = sys::rknn_quant_params {
                    name: name(inp.pick(&["A", "B", "C", "X"])),
                    scale: if inp.u8() % 8 == 0 {
                        null_mut()
                    } else {
                        scales.as_mut_ptr()
                    },
                    scale_len,
                    zp: if inp.u8() % 8 == 0 {
                        null_mut()
                    } else {
                        zps.as_mut_ptr()
                    },
                    zp_len,
                };
                if scales.is_empty() && !p.scale.is_null() {
                    p.scale = null_mut();
                }
                if zps.is_empty() && !p.zp.is_null() {
                    p.zp = null_mut();
                }
                let f = api
                    .rknn_matmul_set_quant_params
                    .expect("the emulator has it");
                let pp = if inp.u8() % 16 == 0 {
                    null_mut()
                } else {
                    &mut p as *mut _
                };
                // SAFETY: arrays of the declared lengths (or NULL).
                unsafe { f(ctx, pp) }
            }
            6 => {
                let ctx = any_ctx(&mut inp, &ctxs, &dead_ctxs);
                let len = inp.pick(&[0usize, 1, 32, 4096]);
                let mut buf = vec![0f32; len];
                let mut p = sys::rknn_quant_params {
                    scale: if len == 0 {
                        null_mut()
                    } else {
                        buf.as_mut_ptr()
                    },
                    scale_len: len as i32,
                    ..Default::default()
                };
                let mut max = 0f32;
                let f = api
                    .rknn_matmul_get_quant_params
                    .expect("the emulator has it");
                let pp = if inp.bool() {
                    null_mut()
                } else {
                    &mut p as *mut _
                };
                let ps = if inp.u8() % 8 == 0 {
                    null_mut()
                } else {
                    &mut max as *mut _
                };
                // SAFETY: `scale_len` floats behind `scale`.
                unsafe { f(ctx, pp, ps) }
            }
            7 => {
                let ctx = any_ctx(&mut inp, &ctxs, &dead_ctxs);
                // SAFETY: a handle value; the emulator checks it.
                unsafe { (api.rknn_matmul_run)(ctx) }
            }
            8 => {
                let ctx = any_ctx(&mut inp, &ctxs, &dead_ctxs);
                // SAFETY: a handle value; the emulator checks it.
                let rc = unsafe { (api.rknn_matmul_destroy)(ctx) };
                let live = ctxs.iter().position(|c| c.handle == ctx);
                assert_eq!(rc == 0, live.is_some(), "destroy of {ctx:#x}: {rc}");
                if let Some(i) = live {
                    ctxs.remove(i);
                    dead_ctxs.push(ctx);
                }
                rc
            }
            9 => {
                let mut i = info(&mut inp);
                // The converter reads K × N elements and writes the native size: keep both
                // small enough to allocate, whatever the rules say about them.
                let small = [1, 16, 31, 32, 33, 64, 96, 0, -1, -32];
                let (k, n): (i32, i32) = (inp.pick(&small), inp.pick(&small));
                let cap = 4 * (k.max(0) as usize + 64) * (n.max(0) as usize + 64);
                let input: Vec<u8> = (0..cap).map(|_| inp.u8()).collect();
                let mut out = vec![0u8; cap];
                let f = api
                    .rknn_B_normal_layout_to_native_layout
                    .expect("the emulator has it");
                let (pi, po): (*mut c_void, *mut c_void) = match inp.u8() % 16 {
                    0 => (null_mut(), out.as_mut_ptr().cast()),
                    1 => (
                        input.as_ptr().cast_mut().cast(),
                        input.as_ptr().cast_mut().cast(),
                    ),
                    _ => (input.as_ptr().cast_mut().cast(), out.as_mut_ptr().cast()),
                };
                // SAFETY: both buffers hold more than the K × N × 2 bytes in and the padded
                // native size out that any accepted (K, N) here needs; the aliased case is
                // refused before any access.
                unsafe { f(pi, po, k, n, &mut i) }
            }
            10 | 11 => {
                let ctx = any_ctx(&mut inp, &ctxs, &dead_ctxs);
                let size = inp.pick(&[
                    0u64,
                    1,
                    64,
                    4096,
                    1 << 20,
                    16 << 20,
                    u64::from(u32::MAX) + 1,
                ]);
                let p = if op == 10 {
                    // SAFETY: plain values.
                    unsafe { (api.rknn_create_mem)(ctx, size as u32) }
                } else {
                    let flags = inp.pick(&[
                        0u64,
                        1,
                        2,
                        4,
                        8,
                        u64::from(sys::RKNN_MEM_FLAG_ALLOC_NO_CONTEXT),
                        u64::MAX,
                    ]);
                    let f = api.rknn_create_mem2.expect("the emulator has it");
                    // SAFETY: plain values.
                    unsafe { f(ctx, size, flags) }
                };
                let size32 = if op == 10 {
                    size as u32
                } else {
                    u32::try_from(size).unwrap_or(0)
                };
                if !p.is_null() {
                    // SAFETY: a live memory the emulator just returned.
                    let m = unsafe { &*p };
                    assert!(m.size >= size32 && !m.virt_addr.is_null());
                    mems.push(Mem {
                        ptr: p,
                        owner: ctx,
                        size: m.size,
                        inside: true,
                    });
                    0
                } else {
                    -1
                }
            }
            12 => {
                let ctx = any_ctx(&mut inp, &ctxs, &dead_ctxs);
                let size: u32 = inp.pick(&[1, 64, 4096, 0]);
                let offset: i32 = inp.pick(&[0, 16, 64, -1]);
                let mut buf = vec![0u8; offset.max(0) as usize + size as usize + 64];
                let virt: *mut c_void = if inp.u8() % 8 == 0 {
                    null_mut()
                } else {
                    buf.as_mut_ptr().cast()
                };
                let p = if inp.bool() {
                    let f = api.rknn_create_mem_from_fd.expect("the emulator has it");
                    // SAFETY: `virt` holds offset + size bytes and is kept alive in `wrapped`
                    // until the emulator is gone.
                    unsafe { f(ctx, inp.pick(&[3, -1, 100]), virt, size, offset) }
                } else {
                    let f = api.rknn_create_mem_from_phys.expect("the emulator has it");
                    // SAFETY: as above.
                    unsafe { f(ctx, 0x1000, virt, size) }
                };
                wrapped.push(buf);
                if !p.is_null() {
                    mems.push(Mem {
                        ptr: p,
                        owner: ctx,
                        size,
                        inside: false,
                    });
                    0
                } else {
                    -1
                }
            }
            13 => {
                let ctx = any_ctx(&mut inp, &ctxs, &dead_ctxs);
                let mem = any_mem(&mut inp, &mems, &dead_mems);
                // SAFETY: `mem` is only compared with the emulator's keys.
                let rc = unsafe { (api.rknn_destroy_mem)(ctx, mem) };
                let live = mems.iter().position(|m| m.ptr == mem && m.owner == ctx);
                assert_eq!(rc == 0, live.is_some(), "destroy_mem: {rc}");
                if let Some(i) = live {
                    mems.remove(i);
                    dead_mems.push(mem);
                }
                rc
            }
            14 => {
                let ctx = any_ctx(&mut inp, &ctxs, &dead_ctxs);
                let mem = any_mem(&mut inp, &mems, &dead_mems);
                let mode = inp.pick(&[1, 2, 3, 0, 4, u32::MAX]);
                let f = api.rknn_mem_sync.expect("the emulator has it");
                // SAFETY: `mem` is only compared with the emulator's keys.
                unsafe { f(ctx, mem, mode) }
            }
            15 => {
                // The program writes a memory through its CPU mapping, as a C caller does.
                if let Some(m) = mems
                    .iter()
                    .filter(|m| m.inside)
                    .nth(inp.u8() as usize % mems.len().max(1))
                {
                    // SAFETY: a live memory allocated inside the emulator: `virt_addr` maps `size` bytes.
                    let bytes = unsafe {
                        std::slice::from_raw_parts_mut(
                            (*m.ptr).virt_addr.cast::<u8>(),
                            m.size as usize,
                        )
                    };
                    let v = inp.u8();
                    for (i, b) in bytes.iter_mut().take(1 << 16).enumerate() {
                        *b = v.wrapping_mul(i as u8).wrapping_add(i as u8 >> 3);
                    }
                }
                0
            }
            16 => {
                let ctx = any_ctx(&mut inp, &ctxs, &dead_ctxs);
                let mut v = sys::rknn_sdk_version::default();
                let size = inp.pick(&[std::mem::size_of::<sys::rknn_sdk_version>() as u32, 0, 16]);
                let cmd = inp.pick(&[5, 0, 1, 99]);
                let p: *mut c_void = if inp.u8() % 8 == 0 {
                    null_mut()
                } else {
                    (&mut v as *mut sys::rknn_sdk_version).cast()
                };
                // SAFETY: `size` is at most the buffer's size.
                unsafe { (api.rknn_query)(ctx, cmd, p, size) }
            }
            _ => {
                let f = api.rknn_emu_last_error.expect("the emulator has it");
                // SAFETY: a NUL-terminated string, read before the next call.
                let s = unsafe { std::ffi::CStr::from_ptr(f()) };
                assert!(s.to_str().is_ok());
                0
            }
        };
        assert!(
            known.contains(&rc),
            "op {op}: undocumented return code {rc}"
        );
        let s = emu.stats();
        assert_eq!(s.contexts, ctxs.len(), "op {op}");
        assert_eq!(s.memories, mems.len(), "op {op}");
        assert_eq!(s.concurrent_uses, 0);
    }
    drop(emu);
    drop(wrapped);
});
