//! What a `.pt2` package says about itself, read from the zip without loading it:
//! AOTInductor's metadata (`AOTI_DEVICE_KEY`, `AOTI_COMPUTE_CAPABILITY`, ..); in
//! packages made by `examples/aoti_export.py`, the exporting torch's version and the
//! inputs and outputs (`triton_rust.*`); and, in every package, the sizes each input's
//! dimensions were exported for (`dims`), read from the checks AOTInductor writes into
//! the package's own wrapper source.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde_json::Value;
use triton_rust_core::config::TensorSpec;
use triton_rust_core::error::{Error, Result};
use triton_rust_core::tensor::DataType;

pub const TORCH_VERSION_KEY: &str = "triton_rust.torch_version";
pub const INPUTS_KEY: &str = "triton_rust.inputs";
pub const OUTPUTS_KEY: &str = "triton_rust.outputs";

#[derive(Debug, Default)]
pub struct Package {
    pub metadata: BTreeMap<String, String>,
    /// The inputs and outputs in the package's flat order, when the metadata lists them.
    pub inputs: Option<Vec<TensorSpec>>,
    pub outputs: Option<Vec<TensorSpec>>,
    /// Per input in the same order: the values `[lo, hi)` it may hold, where the metadata
    /// gives a `range` (an input that indexes an embedding table).
    pub input_ranges: Vec<Option<(i64, i64)>>,
    /// The sizes the compiled code was exported for, per (flat input, dimension).
    pub dims: Dims,
}

/// What the package's compiled code takes in one dimension of one input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DimBounds {
    /// A static dimension: only this size.
    pub fixed: Option<i64>,
    /// A dynamic dimension's smallest and largest size, where the export bounded it.
    pub min: Option<i64>,
    pub max: Option<i64>,
}

impl DimBounds {
    /// Whether `size` is one the compiled code was made for.
    pub fn admits(&self, size: i64) -> bool {
        self.fixed.is_none_or(|f| f == size)
            && self.min.is_none_or(|m| size >= m)
            && self.max.is_none_or(|m| size <= m)
    }

    /// `8..=128`, `exactly 1`, `at most 8`.
    pub fn describe(&self) -> String {
        match (self.fixed, self.min, self.max) {
            (Some(f), _, _) => format!("exactly {f}"),
            (None, Some(lo), Some(hi)) => format!("{lo} to {hi}"),
            (None, Some(lo), None) => format!("at least {lo}"),
            (None, None, Some(hi)) => format!("at most {hi}"),
            (None, None, None) => "any size".into(),
        }
    }
}

/// The bounds of every (flat input, dimension) the package checks.
pub type Dims = BTreeMap<(usize, usize), DimBounds>;

/// Reads the bounds from AOTInductor's generated wrapper (`*.wrapper.cpp`, which
/// `aoti_compile_and_package` puts in every package). For each input it writes a
/// `check_input_<i>` function whose messages name the input, the dimension and the bound:
/// `"input_handles[0]: dim value is too large at 1, " << "expected to be <= 128, "`, `..too
/// small at 1, " << "expected it to be >= 8, "`, `..unmatched dim value at 0, " <<
/// "expected: 1, "`. The generated code runs these checks only when the server's process
/// has `AOTI_RUNTIME_CHECK_INPUTS` set, and then also refuses a batch of 1 (Inductor writes
/// a dynamic dimension's minimum of 1 as 2); read here, they let the engine refuse a
/// request before it reaches the compiled code, where a size past the export (a sequence
/// longer than a position table) indexes out of bounds inside an OpenMP region and ends
/// the process, or trips a device-side assertion on a GPU.
pub fn wrapper_dims(source: &str) -> Dims {
    let mut dims = Dims::new();
    let marker = "\"input_handles[";
    let mut rest = source;
    while let Some(at) = rest.find(marker) {
        rest = &rest[at + marker.len()..];
        let Some((input, after)) = rest.split_once("]: ") else { break };
        let Ok(input) = input.parse::<usize>() else { continue };
        let (kind, after) = if let Some(a) = after.strip_prefix("dim value is too small at ") {
            (0, a)
        } else if let Some(a) = after.strip_prefix("dim value is too large at ") {
            (1, a)
        } else if let Some(a) = after.strip_prefix("unmatched dim value at ") {
            (2, a)
        } else {
            continue;
        };
        let number = |s: &str| -> Option<i64> {
            let s = s.trim_start();
            let end = s.find(|c: char| !(c.is_ascii_digit() || c == '-')).unwrap_or(s.len());
            s[..end].parse().ok()
        };
        let Some(dim) = number(after).and_then(|d| usize::try_from(d).ok()) else { continue };
        // the bound is in the next string literal: `expected it to be >= 8`, `expected
        // to be <= 128`, `expected: 1`
        let Some(expected) = after.find("expected").map(|e| &after[e..]) else { continue };
        let value = match kind {
            0 => expected.split_once(">=").and_then(|(_, v)| number(v)),
            1 => expected.split_once("<=").and_then(|(_, v)| number(v)),
            _ => expected.split_once("expected:").and_then(|(_, v)| number(v)),
        };
        let Some(value) = value else { continue };
        let b = dims.entry((input, dim)).or_default();
        match kind {
            // Inductor writes a minimum of 1 as 2 (it assumes sizes 0 and 1 were specialised
            // away), yet its kernels serve 1: served packages take a batch of one
            0 => b.min = Some(if value == 2 { 1 } else { value }),
            1 => b.max = Some(value),
            _ => b.fixed = Some(value),
        }
    }
    dims
}

impl Package {
    pub fn read(path: &Path) -> Result<Package> {
        let bad = |why: String| {
            Error::invalid_arg(format!(
                "'{}' is not an AOTInductor package (torch._inductor.aoti_compile_and_package): {why}",
                path.display()
            ))
        };
        let file = File::open(path).map_err(|e| bad(e.to_string()))?;
        let mut zip = zip::ZipArchive::new(file).map_err(|e| bad(format!("not a zip: {e}")))?;
        // the wrapper library's metadata (a package may also hold its kernels' copy)
        let names: Vec<String> = zip.file_names().map(str::to_string).collect();
        let in_model = |n: &&String| n.contains("/data/aotinductor/model/");
        let entry = names
            .iter()
            .filter(in_model)
            .find(|n| n.ends_with("wrapper_metadata.json"))
            .or_else(|| names.iter().filter(in_model).find(|n| n.ends_with("_metadata.json")))
            .ok_or_else(|| bad("no data/aotinductor/model/*_metadata.json inside".into()))?
            .clone();
        let mut text = String::new();
        zip.by_name(&entry)
            .map_err(|e| bad(e.to_string()))?
            .read_to_string(&mut text)
            .map_err(|e| bad(format!("{entry}: {e}")))?;
        let mut package = Package::from_metadata_json(&text)
            .map_err(|e| e.context(format!("'{}'", path.display())))?;
        // the wrapper beside the metadata read above
        let wrapper = entry
            .strip_suffix("_metadata.json")
            .map(|stem| format!("{stem}.cpp"))
            .filter(|w| names.contains(w))
            .or_else(|| {
                names.iter().filter(in_model).find(|n| n.ends_with(".wrapper.cpp")).cloned()
            });
        if let Some(wrapper) = wrapper {
            let mut source = String::new();
            zip.by_name(&wrapper)
                .map_err(|e| bad(e.to_string()))?
                .read_to_string(&mut source)
                .map_err(|e| bad(format!("{wrapper}: {e}")))?;
            package.dims = wrapper_dims(&source);
        }
        Ok(package)
    }

    pub fn from_metadata_json(text: &str) -> Result<Package> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::invalid_arg(format!("the package metadata is not JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(Error::invalid_arg("the package metadata is not a JSON object"));
        };
        let metadata: BTreeMap<String, String> = map
            .into_iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                (k, v)
            })
            .collect();
        let tensors = |key: &str| metadata.get(key).map(|t| tensor_list(key, t)).transpose();
        let inputs = tensors(INPUTS_KEY)?;
        let outputs = tensors(OUTPUTS_KEY)?;
        let input_ranges = metadata.get(INPUTS_KEY).map(|t| ranges(INPUTS_KEY, t)).transpose()?;
        Ok(Package {
            metadata,
            inputs,
            outputs,
            input_ranges: input_ranges.unwrap_or_default(),
            dims: Dims::new(),
        })
    }

    /// The torch release that made the package (`2.11.0` of `2.11.0+cu130`), if it says.
    pub fn torch_release(&self) -> Option<&str> {
        self.metadata.get(TORCH_VERSION_KEY).map(|v| release(v))
    }
}

/// `2.11.0` of `2.11.0+cu130` or `2.14.0a0+abcdef`.
pub fn release(version: &str) -> &str {
    version.split('+').next().unwrap_or(version).trim()
}

fn tensor_list(key: &str, text: &str) -> Result<Vec<TensorSpec>> {
    let bad = |why: String| Error::invalid_arg(format!("package metadata '{key}': {why}"));
    let list: Vec<Value> =
        serde_json::from_str(text).map_err(|e| bad(format!("not a JSON list: {e}")))?;
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let name = t["name"].as_str().ok_or_else(|| bad(format!("entry {i} has no name")))?;
            let dtype = t["dtype"].as_str().ok_or_else(|| bad(format!("'{name}' has no dtype")))?;
            let shape = t["shape"]
                .as_array()
                .and_then(|s| s.iter().map(Value::as_i64).collect::<Option<Vec<i64>>>())
                .ok_or_else(|| bad(format!("'{name}' has no shape of integers")))?;
            Ok(TensorSpec { name: name.to_string(), dtype: torch_dtype(dtype)?, shape })
        })
        .collect()
}

/// The `range` of each entry of a tensor list (`[lo, hi]`, lo < hi; None where it has none).
fn ranges(key: &str, text: &str) -> Result<Vec<Option<(i64, i64)>>> {
    let list: Vec<Value> = serde_json::from_str(text).map_err(|e| {
        Error::invalid_arg(format!("package metadata '{key}': not a JSON list: {e}"))
    })?;
    list.iter()
        .map(|t| match &t["range"] {
            Value::Null => Ok(None),
            Value::Array(r) => {
                match (r.first().and_then(Value::as_i64), r.get(1).and_then(Value::as_i64)) {
                    (Some(lo), Some(hi)) if r.len() == 2 && lo < hi => Ok(Some((lo, hi))),
                    _ => Err(Error::invalid_arg(format!(
                        "package metadata '{key}': '{}' has range {}, not [lo, hi] with lo < hi",
                        t["name"].as_str().unwrap_or("?"),
                        t["range"]
                    ))),
                }
            }
            other => Err(Error::invalid_arg(format!(
                "package metadata '{key}': '{}' has range {other}, not [lo, hi]",
                t["name"].as_str().unwrap_or("?")
            ))),
        })
        .collect()
}

/// A torch dtype's name (`float32`, `torch.float16`) as the backend's element type.
pub fn torch_dtype(name: &str) -> Result<DataType> {
    Ok(match name.trim_start_matches("torch.") {
        "bool" => DataType::Bool,
        "uint8" => DataType::U8,
        "int8" => DataType::I8,
        "int16" | "short" => DataType::I16,
        "int32" | "int" => DataType::I32,
        "int64" | "long" => DataType::I64,
        "float16" | "half" => DataType::F16,
        "bfloat16" => DataType::Bf16,
        "float32" | "float" => DataType::F32,
        "float64" | "double" => DataType::F64,
        other => {
            return Err(Error::unsupported(format!(
                "torch dtype '{other}' has no Triton data type the AOTInductor engine serves"
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_gives_the_tensors_and_the_release() {
        let text = r#"{"AOTI_DEVICE_KEY": "cpu",
            "triton_rust.torch_version": "2.11.0+cu130",
            "triton_rust.inputs": "[{\"name\": \"INPUT__0\", \"dtype\": \"float32\", \"shape\": [-1, 3]}]",
            "triton_rust.outputs": "[{\"name\": \"OUTPUT__0\", \"dtype\": \"torch.int64\", \"shape\": [-1]}]"}"#;
        let p = Package::from_metadata_json(text).unwrap();
        assert_eq!(p.torch_release(), Some("2.11.0"));
        assert_eq!(p.metadata["AOTI_DEVICE_KEY"], "cpu");
        let i = &p.inputs.unwrap()[0];
        assert_eq!(
            (i.name.as_str(), i.dtype, i.shape.as_slice()),
            ("INPUT__0", DataType::F32, &[-1, 3][..])
        );
        assert_eq!(p.outputs.unwrap()[0].dtype, DataType::I64);
        assert_eq!(p.input_ranges, vec![None]);
        let ranged = r#"{"triton_rust.inputs": "[{\"name\": \"ids\", \"dtype\": \"int64\", \"shape\": [-1, 8], \"range\": [0, 148]}, {\"name\": \"x\", \"dtype\": \"float32\", \"shape\": [-1]}]"}"#;
        assert_eq!(
            Package::from_metadata_json(ranged).unwrap().input_ranges,
            vec![Some((0, 148)), None]
        );
        let reversed = ranged.replace("[0, 148]", "[148, 0]");
        let e = Package::from_metadata_json(&reversed).unwrap_err();
        assert!(e.message().contains("'ids' has range [148,0]"), "{e}");
        let plain = Package::from_metadata_json(r#"{"AOTI_DEVICE_KEY": "cuda"}"#).unwrap();
        assert!(plain.inputs.is_none() && plain.torch_release().is_none());
        let e = Package::from_metadata_json(r#"{"triton_rust.inputs": "[{\"name\": \"x\"}]"}"#);
        assert!(e.unwrap_err().message().contains("'x' has no dtype"));
        assert!(torch_dtype("complex64").is_err());
        assert_eq!(release("2.14.0a0+abc"), "2.14.0a0");
    }

    #[test]
    fn the_wrappers_own_checks_give_each_dimensions_bounds() {
        // as torch 2.11's AOTInductor writes them (a batch Dim(min=1, max=8), a sequence
        // Dim(min=8, max=128), a second input of a static batch of 1 and a fixed width)
        let source = r#"
        if (arg1_1_size[0] < 2) {
            std::stringstream ss;
            ss << "input_handles[0]: dim value is too small at 0, "
               << "expected it to be >= 2, " << "but got: "
               << arg1_1_size[0] << "\n";
        }
        if (arg1_1_size[0] > 8) {
            ss << "input_handles[0]: dim value is too large at 0, "
               << "expected to be <= 8, " << "but got: "
        }
            ss << "input_handles[0]: dim value is too small at 1, "
               << "expected it to be >= 8, " << "but got: "
            ss << "input_handles[0]: dim value is too large at 1, "
               << "expected to be <= 128, " << "but got: "
            ss << "input_handles[0]: unmatched stride value at 1, "
               << "expected: 1, " << "but got: " << arg1_1_stride[1]
            ss << "input_handles[0]: unmatched dtype, "
               << "expected: " << arg1_1_expected_dtype << "(at::kLong), "
            ss << "input_handles[12]: unmatched dim value at 0, "
               << "expected: 1, " << "but got: " << arg2_1_size[0]
            ss << "input_handles[12]: unmatched dim value at 1, "
               << "expected: 1000, " << "but got: " << arg2_1_size[1]
        "#;
        let dims = wrapper_dims(source);
        let b = |min, max, fixed| DimBounds { min, max, fixed };
        assert_eq!(dims[&(0, 0)], b(Some(1), Some(8), None), "a minimum of 2 admits 1");
        assert_eq!(dims[&(0, 1)], b(Some(8), Some(128), None));
        assert_eq!(dims[&(12, 0)], b(None, None, Some(1)));
        assert_eq!(dims[&(12, 1)], b(None, None, Some(1000)));
        assert_eq!(dims.len(), 4, "strides and dtypes are not dimensions: {dims:?}");
        assert!(dims[&(0, 1)].admits(128) && !dims[&(0, 1)].admits(600));
        assert!(!dims[&(0, 1)].admits(7));
        assert_eq!(dims[&(0, 1)].describe(), "8 to 128");
        assert_eq!(dims[&(12, 0)].describe(), "exactly 1");
        assert!(wrapper_dims("no checks here").is_empty());
    }
}
