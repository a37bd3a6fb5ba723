//! Link-time declarations of the runtime's symbols (feature `link`): `-lrknnrt` must resolve them.

use crate::bindings::*;
use std::os::raw::{c_int, c_void};

#[link(name = "rknnrt")]
unsafe extern "C" {
    pub fn rknn_matmul_create(
        ctx: *mut rknn_matmul_ctx,
        info: *mut rknn_matmul_info,
        io_attr: *mut rknn_matmul_io_attr,
    ) -> c_int;
    pub fn rknn_matmul_create_dynamic_shape(
        ctx: *mut rknn_matmul_ctx,
        info: *mut rknn_matmul_info,
        shape_num: c_int,
        dynamic_shapes: *mut rknn_matmul_shape,
        io_attrs: *mut rknn_matmul_io_attr,
    ) -> c_int;
    pub fn rknn_matmul_set_dynamic_shape(
        ctx: rknn_matmul_ctx,
        shape: *mut rknn_matmul_shape,
    ) -> c_int;
    pub fn rknn_matmul_set_io_mem(
        ctx: rknn_matmul_ctx,
        mem: *mut rknn_tensor_mem,
        attr: *mut rknn_matmul_tensor_attr,
    ) -> c_int;
    pub fn rknn_matmul_set_core_mask(context: rknn_matmul_ctx, core_mask: rknn_core_mask) -> c_int;
    pub fn rknn_matmul_set_quant_params(
        context: rknn_matmul_ctx,
        params: *mut rknn_quant_params,
    ) -> c_int;
    pub fn rknn_matmul_get_quant_params(
        ctx: rknn_matmul_ctx,
        params: *mut rknn_quant_params,
        scale: *mut f32,
    ) -> c_int;
    pub fn rknn_matmul_run(ctx: rknn_matmul_ctx) -> c_int;
    pub fn rknn_matmul_destroy(ctx: rknn_matmul_ctx) -> c_int;
    pub fn rknn_B_normal_layout_to_native_layout(
        B_input: *mut c_void,
        B_output: *mut c_void,
        K: c_int,
        N: c_int,
        info: *mut rknn_matmul_info,
    ) -> c_int;
    pub fn rknn_create_mem(ctx: rknn_context, size: u32) -> *mut rknn_tensor_mem;
    pub fn rknn_create_mem2(ctx: rknn_context, size: u64, alloc_flags: u64)
    -> *mut rknn_tensor_mem;
    pub fn rknn_create_mem_from_fd(
        ctx: rknn_context,
        fd: i32,
        virt_addr: *mut c_void,
        size: u32,
        offset: i32,
    ) -> *mut rknn_tensor_mem;
    pub fn rknn_create_mem_from_phys(
        ctx: rknn_context,
        phys_addr: u64,
        virt_addr: *mut c_void,
        size: u32,
    ) -> *mut rknn_tensor_mem;
    pub fn rknn_destroy_mem(ctx: rknn_context, mem: *mut rknn_tensor_mem) -> c_int;
    pub fn rknn_mem_sync(
        context: rknn_context,
        mem: *mut rknn_tensor_mem,
        mode: rknn_mem_sync_mode,
    ) -> c_int;
    pub fn rknn_set_core_mask(context: rknn_context, core_mask: rknn_core_mask) -> c_int;
    pub fn rknn_query(
        context: rknn_context,
        cmd: rknn_query_cmd,
        info: *mut c_void,
        size: u32,
    ) -> c_int;
}
