//! Element types and matmul types at the type level: a context's A, B and C element types are
//! fixed by its [`MatmulKind`], so a buffer of the wrong type cannot be bound.

use half::f16;
use rknn_chip::{ElemKind, MatmulType};

mod sealed {
    pub trait Sealed {}
}

/// Two int4 values in one byte: the even element in the low nibble, two's complement
/// (fact sheet §7). The storage element of every int4 matrix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct I4x2(pub u8);

impl I4x2 {
    /// Packs two values in -8..=7 (`lo` is the even element).
    ///
    /// ```
    /// use rknn_matmul::I4x2;
    /// let p = I4x2::new(-8, 7);
    /// assert_eq!(p.get(), (-8, 7));
    /// assert_eq!(p.0, 0x78);
    /// ```
    pub fn new(lo: i8, hi: i8) -> I4x2 {
        debug_assert!(
            (-8..=7).contains(&lo) && (-8..=7).contains(&hi),
            "int4 values are -8..=7"
        );
        I4x2((lo as u8 & 0xf) | ((hi as u8 & 0xf) << 4))
    }

    /// The two values (even element first).
    pub fn get(self) -> (i8, i8) {
        (((self.0 << 4) as i8) >> 4, (self.0 as i8) >> 4)
    }
}

/// A type the NPU stores: plain old data with a fixed size and no padding.
///
/// # Safety
/// Implementors must be `Copy`, have no padding and accept every bit pattern, since their
/// bytes are shared with the device. Sealed: only this crate implements it.
pub unsafe trait Element:
    Copy + Default + Send + Sync + std::fmt::Debug + sealed::Sealed + 'static
{
    /// The element kind.
    const KIND: ElemKind;
    /// Logical values per stored element (2 for [`I4x2`], 1 otherwise).
    const PER_ELEMENT: usize = 1;

    /// The element's bytes in the order the runtime reads them (little-endian: every chip of
    /// the family is little-endian).
    fn to_le_bytes_vec(self) -> Vec<u8>;

    /// The element from `size_of::<Self>()` little-endian bytes.
    fn from_le_bytes_slice(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($($t:ty => $kind:ident),*) => {$(
        impl sealed::Sealed for $t {}
        // SAFETY: a primitive (or a transparent wrapper of one): no padding, every bit pattern valid.
        unsafe impl Element for $t {
            const KIND: ElemKind = ElemKind::$kind;
            fn to_le_bytes_vec(self) -> Vec<u8> {
                self.to_le_bytes().to_vec()
            }
            fn from_le_bytes_slice(bytes: &[u8]) -> Self {
                let mut b = [0u8; std::mem::size_of::<$t>()];
                b.copy_from_slice(bytes);
                <$t>::from_le_bytes(b)
            }
        }
    )*};
}
element!(i8 => I8, i16 => I16, i32 => I32, f32 => F32, f16 => F16);

impl sealed::Sealed for I4x2 {}
// SAFETY: `repr(transparent)` over `u8`.
unsafe impl Element for I4x2 {
    const KIND: ElemKind = ElemKind::I4;
    const PER_ELEMENT: usize = 2;
    fn to_le_bytes_vec(self) -> Vec<u8> {
        vec![self.0]
    }
    fn from_le_bytes_slice(bytes: &[u8]) -> Self {
        I4x2(bytes[0])
    }
}

/// A matmul type with its element types: the type parameter of [`crate::Matmul`].
pub trait MatmulKind: sealed::Sealed + Send + 'static {
    /// The runtime's matmul type.
    const TYPE: MatmulType;
    /// Element of A.
    type A: Element;
    /// Element of B.
    type B: Element;
    /// Element of C.
    type C: Element;
}

macro_rules! kinds {
    ($($(#[$doc:meta])* $name:ident = $t:ident: $a:ty, $b:ty, $c:ty;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name;
        impl sealed::Sealed for $name {}
        impl MatmulKind for $name {
            const TYPE: MatmulType = MatmulType::$t;
            type A = $a;
            type B = $b;
            type C = $c;
        }
    )*};
}

kinds! {
    /// f16 × f16 → f32 (type 1; every chip).
    F16xF16ToF32 = F16_F16_F32: f16, f16, f32;
    /// i8 × i8 → i32 (type 2; every chip). Exact.
    I8xI8ToI32 = I8_I8_I32: i8, i8, i32;
    /// i8 × i8 → i8 requantised (type 3; RK3588).
    I8xI8ToI8 = I8_I8_I8: i8, i8, i8;
    /// f16 × f16 → f16 (type 4; RK3588, RK3576).
    F16xF16ToF16 = F16_F16_F16: f16, f16, f16;
    /// f16 × i8 → f32 (type 5; RK3576 only: weight-only int8).
    F16xI8ToF32 = F16_I8_F32: f16, i8, f32;
    /// f16 × i4 → f32 (type 7; RK3576 only: weight-only int4).
    F16xI4ToF32 = F16_I4_F32: f16, I4x2, f32;
    /// f16 × i4 → f16 (type 8; RK3576 only).
    F16xI4ToF16 = F16_I4_F16: f16, I4x2, f16;
    /// i8 × i8 → f32 dequantised (type 9; RK3588).
    I8xI8ToF32 = I8_I8_F32: i8, i8, f32;
    /// i4 × i4 → i16 (type 10; RK3588: W4A4, the only int4 mode there).
    I4xI4ToI16 = I4_I4_I16: I4x2, I4x2, i16;
    /// i8 × i4 → i32 (type 11; RK3576 only).
    I8xI4ToI32 = I8_I4_I32: i8, I4x2, i32;
}

/// A quantisation scheme, named by weight and activation precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// f16 weights and activations.
    F16,
    /// int8 weights and activations.
    W8A8,
    /// int4 weights and int4 activations.
    W4A4,
    /// int8 weights, f16 activations (weight-only int8).
    W8A16,
    /// int4 weights, f16 activations (weight-only int4).
    W4A16,
    /// int4 weights, int8 activations.
    W4A8,
}

impl Scheme {
    /// Every scheme.
    pub const ALL: [Scheme; 6] = [
        Scheme::F16,
        Scheme::W8A8,
        Scheme::W4A4,
        Scheme::W8A16,
        Scheme::W4A16,
        Scheme::W4A8,
    ];

    /// The scheme of a matmul type.
    pub fn of(t: MatmulType) -> Scheme {
        use rknn_chip::ElemKind::*;
        match (t.a, t.b) {
            (F16, F16) => Scheme::F16,
            (I8, I8) => Scheme::W8A8,
            (I4, I4) => Scheme::W4A4,
            (F16, I8) => Scheme::W8A16,
            (F16, I4) => Scheme::W4A16,
            _ => Scheme::W4A8,
        }
    }

    /// Whether the weights are narrower than the activations.
    pub fn is_weight_only(self) -> bool {
        matches!(self, Scheme::W8A16 | Scheme::W4A16 | Scheme::W4A8)
    }
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// The bytes of `values` (every [`Element`] is plain data without padding).
pub(crate) fn as_bytes<T: Element>(values: &[T]) -> &[u8] {
    // SAFETY: `T: Element` is `Copy`, has no padding and accepts every bit pattern (the trait's
    // contract), so all `size_of_val(values)` bytes are initialised; `u8` has alignment 1 and
    // the slice borrows `values`, so it lives as long as they do and nothing writes them.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    }
}

/// The bytes of `values`, to write (every [`Element`] accepts every bit pattern).
pub(crate) fn as_bytes_mut<T: Element>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: `T: Element` is `Copy`, has no padding and accepts every bit pattern (the trait's
    // contract), so any bytes written leave valid values; `u8` has alignment 1 and the slice
    // borrows `values` mutably, so nothing else reads or writes them while it lives.
    unsafe {
        std::slice::from_raw_parts_mut(
            values.as_mut_ptr().cast::<u8>(),
            std::mem::size_of_val(values),
        )
    }
}

/// `bytes` as values of `T`, if they are aligned for `T` and whole values.
pub(crate) fn from_bytes<T: Element>(bytes: &[u8]) -> Option<&[T]> {
    let size = std::mem::size_of::<T>();
    if bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 || bytes.len() % size != 0 {
        return None;
    }
    // SAFETY: the pointer is aligned for `T` and the length is a whole number of `T`s (both
    // checked above); `T: Element` accepts every bit pattern (the trait's contract), so every
    // value read is valid; the slice borrows `bytes`, so it lives as long as they do and
    // nothing writes them meanwhile.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) })
}
