//! Element types between the ABI and libtorch, and a module's result as tensors.

use tch::{IValue, Kind, Tensor};
use triton_rust_abi::dtype;

pub(crate) fn kind_of(d: i32) -> Result<Kind, String> {
    Ok(match d {
        dtype::BOOL => Kind::Bool,
        dtype::U8 => Kind::Uint8,
        dtype::I8 => Kind::Int8,
        dtype::I16 => Kind::Int16,
        dtype::I32 => Kind::Int,
        dtype::I64 => Kind::Int64,
        dtype::F16 => Kind::Half,
        dtype::F32 => Kind::Float,
        dtype::F64 => Kind::Double,
        dtype::BF16 => Kind::BFloat16,
        other => return Err(format!("element type {other} is not supported by the torch engine")),
    })
}

pub(crate) fn dtype_of(k: Kind) -> Result<i32, String> {
    Ok(match k {
        Kind::Bool => dtype::BOOL,
        Kind::Uint8 => dtype::U8,
        Kind::Int8 => dtype::I8,
        Kind::Int16 => dtype::I16,
        Kind::Int => dtype::I32,
        Kind::Int64 => dtype::I64,
        Kind::Half => dtype::F16,
        Kind::Float => dtype::F32,
        Kind::Double => dtype::F64,
        Kind::BFloat16 => dtype::BF16,
        other => {
            return Err(format!("the model produced a {other:?} tensor, which Triton cannot carry"))
        }
    })
}

/// Flattens a module's result into tensors: a tensor, or a tuple/list of them.
pub(crate) fn tensors(v: IValue, out: &mut Vec<Tensor>) -> Result<(), String> {
    match v {
        IValue::Tensor(t) => out.push(t),
        IValue::Tuple(items) | IValue::GenericList(items) => {
            for i in items {
                tensors(i, out)?;
            }
        }
        IValue::TensorList(ts) => out.extend(ts),
        other => return Err(format!("the model returned a {other:?}; expected tensors")),
    }
    Ok(())
}
