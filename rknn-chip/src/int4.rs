//! How `rknn_B_normal_layout_to_native_layout` reads int4 B: an \[open\] question the SDK keeps
//! as a setting shared by the emulator and the safe layer.
//!
//! * Rockchip's own 2.x matmul demos pack two int4 values per byte (even element in the low
//!   nibble) before they call the converter, for every int4 type.
//! * A third-party RKNN backend's source says in a comment that the converter wants one value
//!   per byte and that packed input gives severe errors.
//!
//! Only a board settles it. The default follows the vendor's demos ([`Int4ConverterInput::Packed`]);
//! `RKNN_INT4_B_CONVERTER_INPUT=one-per-byte` selects the other reading.

use std::fmt;
use std::str::FromStr;

/// Environment variable that selects the int4 input of the B converter: `packed` or
/// `one-per-byte`. Read by the emulator's drop-in library and by the safe layer.
pub const INT4_CONVERTER_INPUT_ENV: &str = "RKNN_INT4_B_CONVERTER_INPUT";

/// The form of int4 B given to `rknn_B_normal_layout_to_native_layout` (\[open\], see the
/// module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Int4ConverterInput {
    /// Two values per byte, even element in the low nibble: what Rockchip's 2.x demos pass
    /// (default).
    #[default]
    Packed,
    /// One value per byte (an `int8_t` in -8..=7): what a third-party backend's comment says.
    OnePerByte,
}

impl Int4ConverterInput {
    /// The setting's value as written in [`INT4_CONVERTER_INPUT_ENV`]: `packed` or `one-per-byte`.
    pub const fn name(self) -> &'static str {
        match self {
            Int4ConverterInput::Packed => "packed",
            Int4ConverterInput::OnePerByte => "one-per-byte",
        }
    }

    /// The setting from [`INT4_CONVERTER_INPUT_ENV`]; the default ([`Int4ConverterInput::Packed`])
    /// when the variable is unset or empty.
    pub fn from_env() -> Result<Int4ConverterInput, UnknownInt4ConverterInput> {
        match std::env::var(INT4_CONVERTER_INPUT_ENV) {
            Ok(v) if !v.trim().is_empty() => v.parse(),
            Ok(_) => Ok(Int4ConverterInput::default()),
            Err(std::env::VarError::NotPresent) => Ok(Int4ConverterInput::default()),
            Err(std::env::VarError::NotUnicode(v)) => {
                Err(UnknownInt4ConverterInput(v.to_string_lossy().into_owned()))
            }
        }
    }
}

impl fmt::Display for Int4ConverterInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A value of the int4 converter setting that is neither `packed` nor `one-per-byte`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown int4 converter input {0:?} (set by {INT4_CONVERTER_INPUT_ENV}): expected packed or one-per-byte"
)]
pub struct UnknownInt4ConverterInput(pub String);

impl FromStr for Int4ConverterInput {
    type Err = UnknownInt4ConverterInput;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "packed" => Ok(Int4ConverterInput::Packed),
            "one-per-byte" => Ok(Int4ConverterInput::OnePerByte),
            _ => Err(UnknownInt4ConverterInput(s.to_string())),
        }
    }
}
