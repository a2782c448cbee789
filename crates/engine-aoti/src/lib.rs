//! The AOTInductor engine: PyTorch 2 packages (`model.pt2`, made by `torch.export` and
//! `torch._inductor.aoti_compile_and_package`) through the `libtriton_rust_aoti.so`
//! plugin, which runs them with libtorch's C++ package loader.
//!
//! A model names it with `parameters { key: "engine" value { string_value: "aoti" } }`
//! or with Triton's `platform: "torch_aoti"`. What the package says of itself is read from
//! the zip at load (`package`): the device it was compiled for and, in packages made by
//! `examples/aoti_export.py`, the exporting torch's version and its inputs and outputs
//! (names, types, shapes, which dimensions are dynamic), from which the config is
//! auto-completed. A package whose every tensor has a dynamic first dimension serves
//! Triton's dynamic batcher like any model: the batch is assembled, run once, scattered.
//! Names follow Triton's PyTorch backend (`names`). On a GPU instance inputs and outputs
//! stay in GPU memory, each instance runs on its own stream, and
//! `optimization { cuda { graphs: true } }` captures a CUDA graph per batch bucket.

use std::ffi::CString;
use std::path::Path;

use triton_rust_abi::plugin::{self, from_abi, to_abi};
use triton_rust_core::batch::{BatchTensor, RequestTensor};
use triton_rust_core::config::{ModelConfig, TensorConfig, TensorSpec};
use triton_rust_core::engine::{Device, Engine, EngineOptions, OutputView, Signature};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::settings::Known;
use triton_rust_core::tensor::DataType;

pub mod names;
pub mod package;

use package::{DimBounds, Package};

/// The AOTInductor engine reads no model parameters of its own.
pub const KNOWN: &[Known] = &[];

pub struct AotiEngine {
    /// `None` for the load-time probe.
    model: Option<plugin::PluginModel>,
    sig: Signature,
    /// The config's inputs (their index in `sig.inputs`) in the package's flat order.
    input_order: Vec<usize>,
    input_names: Vec<CString>,
    /// One name per flat output of the package; empty where the config does not list it.
    output_names: Vec<CString>,
    /// The inputs whose values the package bounds, by name, and the values `[lo, hi)` each
    /// may hold (`check_ranges`).
    ranges: Vec<(String, (i64, i64))>,
    /// The sizes the package was exported for, by input name and dimension of the request's
    /// shape (`check_dims`).
    dims: Vec<(String, usize, DimBounds)>,
    outputs_on_host: bool,
}

/// `2.11.0` of the plugin's runtime text `libtorch 2.11.0 (AOTInductor, CUDA)`.
fn runtime_release(runtime: &str) -> &str {
    package::release(runtime.split_whitespace().nth(1).unwrap_or(runtime))
}

/// `(major, minor, patch)` of a release like `2.11.0` or `2.14.0a0`.
fn release_numbers(release: &str) -> Vec<u64> {
    release
        .split('.')
        .map(|p| {
            p.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap_or(0)
        })
        .collect()
}

/// A package made by a newer torch than the server's libtorch is refused: it may call
/// functions of AOTInductor's C interface that the older libtorch lacks. One made by an
/// older torch loads (that interface is kept for older packages); the note says so, and
/// names both releases if the load then fails.
fn check_release(made: Option<&str>, runs: &str, model_file: &Path) -> Result<Option<String>> {
    let Some(made) = made else { return Ok(None) };
    if made == runs {
        return Ok(None);
    }
    if release_numbers(made) > release_numbers(runs) {
        return Err(Error::invalid_arg(format!(
            "'{}' was made by torch {made}, and this server's libtorch is {runs}, an older release: export it again with torch {runs}, or build libtriton_rust_aoti.so against libtorch {made} and serve with it (docs/pytorch2.md)",
            model_file.display()
        )));
    }
    Ok(Some(format!(
        "'{}' was made by torch {made} and runs on libtorch {runs} (AOTInductor's C interface carries older packages to newer releases; exporting with torch {runs} is the tested way)",
        model_file.display()
    )))
}

fn batch_dims(cfg: &ModelConfig, t: &TensorConfig) -> Vec<i64> {
    let mut shape = if cfg.batching() { vec![-1] } else { Vec::new() };
    shape.extend(t.reshape.as_ref().unwrap_or(&t.dims));
    shape
}

/// The model's tensors as the engine sees them: the config's, typed and shaped by the
/// package where its metadata lists them, plus any listed tensor the config leaves out
/// (so the config check names it); and the flat position of each config tensor.
fn tensors(
    cfg: &ModelConfig,
    config: &[TensorConfig],
    listed: Option<&[TensorSpec]>,
    spec: Option<&str>,
    inputs: bool,
) -> Result<(Vec<TensorSpec>, Vec<usize>)> {
    let kind = if inputs { "inputs" } else { "outputs" };
    if config.is_empty() {
        let listed = listed.ok_or_else(|| {
            Error::invalid_arg(format!(
                "the package does not list its {kind} (it was not made by examples/aoti_export.py): list every input and output in config.pbtxt"
            ))
        })?;
        return Ok((listed.to_vec(), (0..listed.len()).collect()));
    }
    let names: Vec<&str> = config.iter().map(|t| t.name.as_str()).collect();
    let listed_names: Option<Vec<String>> =
        listed.map(|l| l.iter().map(|t| t.name.clone()).collect());
    let pos = names::positions(&names, listed_names.as_deref(), spec, inputs)?;
    let mut specs = Vec::with_capacity(config.len());
    for (t, &p) in config.iter().zip(&pos) {
        let spec = match listed {
            Some(l) => {
                let model = l.get(p).ok_or_else(|| {
                    Error::invalid_arg(format!(
                        "tensor '{}' is the package's {kind} {p}, and the package has {}",
                        t.name,
                        l.len()
                    ))
                })?;
                TensorSpec { name: t.name.clone(), dtype: model.dtype, shape: model.shape.clone() }
            }
            None => TensorSpec { name: t.name.clone(), dtype: t.dtype, shape: batch_dims(cfg, t) },
        };
        specs.push(spec);
    }
    if let Some(l) = listed {
        // what the config does not feed: the config check refuses a missing input
        specs
            .extend(l.iter().enumerate().filter(|(i, _)| !pos.contains(i)).map(|(_, t)| t.clone()));
    }
    Ok((specs, pos))
}

impl AotiEngine {
    pub fn load(model_file: &Path, options: &EngineOptions<'_>) -> Result<AotiEngine> {
        let cfg = options.config;
        let package = Package::read(model_file)?;
        let plugin = plugin::plugin(
            &plugin::AOTI,
            options.backend.libtorch_dir.as_ref().map(|(d, source)| (d.as_path(), *source)),
        )?;
        let runs = runtime_release(plugin.runtime()).to_string();
        let made = package.torch_release().map(str::to_string);
        let across = check_release(made.as_deref(), &runs, model_file)?;
        if let (Some(note), false) = (&across, options.probe) {
            log::info!("model '{}': {note}", cfg.name);
        }
        for t in cfg.inputs.iter().chain(&cfg.outputs) {
            to_abi(t.dtype).map_err(|e| e.context(format!("tensor '{}'", t.name)))?;
        }
        let (inputs, mut in_pos) =
            tensors(cfg, &cfg.inputs, package.inputs.as_deref(), None, true)?;
        let (outputs, mut out_pos) =
            tensors(cfg, &cfg.outputs, package.outputs.as_deref(), None, false)?;
        if cfg.batching() {
            check_batch_dims(cfg, &package, &in_pos, &inputs)?;
            if let Some(t) = inputs.iter().chain(&outputs).find(|t| t.shape.first() != Some(&-1)) {
                return Err(Error::invalid_arg(format!(
                    "max_batch_size {} asks for batching, but the package's tensor '{}' has shape {:?}, a fixed first dimension: export it with a dynamic batch dimension (torch.export.Dim(\"batch\") on dimension 0 of every input; examples/aoti_export.py), or serve it with max_batch_size: 0",
                    cfg.max_batch_size, t.name, t.shape
                )));
            }
        }
        let gpu = match options.device {
            Device::Gpu(id) => Some(id),
            Device::Cpu => None,
        };
        let buckets = cfg.cuda_graph_buckets()?;
        let model = if options.probe {
            None
        } else {
            let model = plugin.load(&plugin::LoadSpec {
                path: model_file,
                gpu,
                intra_op_threads: 0,
                cudnn: true,
                optimized_execution: true,
                tensor_fuser: None,
                jit_profiling: None,
                fusion_strategy: &[],
                cuda_graphs: if gpu.is_some() { buckets.as_deref() } else { None },
                graph_exact_rows: !cfg.batching(),
            });
            let model = match (model, &across) {
                (Err(e), Some(note)) => return Err(e.context(note.clone())),
                (m, _) => m?,
            };
            // keyword arguments and dict entries of a package that does not list its
            // tensors: placed through the call spec, known now that it is loaded
            let keyed = |ts: &[TensorConfig]| {
                ts.iter().any(|t| matches!(names::slot(&t.name), Some(names::Slot::Key(_))))
            };
            if package.inputs.is_none() && keyed(&cfg.inputs)
                || package.outputs.is_none() && keyed(&cfg.outputs)
            {
                let spec = model.call_spec()?.ok_or_else(|| {
                    Error::invalid_arg("the package has no call spec to place KWARGS/RESULT names")
                })?;
                in_pos = tensors(cfg, &cfg.inputs, None, Some(&spec[0]), true)?.1;
                out_pos = tensors(cfg, &cfg.outputs, None, Some(&spec[1]), false)?.1;
            }
            Some(model)
        };
        let cstr =
            |s: &str| CString::new(s).map_err(|_| Error::invalid_arg("tensor name has a NUL"));
        let mut input_order: Vec<usize> = (0..in_pos.len()).collect();
        input_order.sort_by_key(|&i| in_pos[i]);
        let flat: Vec<usize> = input_order.iter().map(|&i| in_pos[i]).collect();
        if flat.iter().enumerate().any(|(i, &p)| i != p) {
            return Err(Error::invalid_arg(format!(
                "the config's inputs are the package's inputs {flat:?}: a package takes all its inputs, each once"
            )));
        }
        let n_out = package
            .outputs
            .as_ref()
            .map_or(0, Vec::len)
            .max(out_pos.iter().max().map_or(0, |m| m + 1));
        let mut output_names = vec![CString::default(); n_out];
        for (j, &p) in out_pos.iter().enumerate() {
            output_names[p] = cstr(&outputs[j].name)?;
        }
        let input_names =
            input_order.iter().map(|&i| cstr(&inputs[i].name)).collect::<Result<_>>()?;
        let ranges = in_pos
            .iter()
            .zip(&inputs)
            .filter_map(|(&p, t)| {
                Some((t.name.clone(), package.input_ranges.get(p).copied().flatten()?))
            })
            .collect();
        let dims = in_pos
            .iter()
            .zip(&cfg.inputs)
            .filter(|(_, c)| c.reshape.is_none())
            .flat_map(|(&p, c)| {
                package
                    .dims
                    .range((p, 0)..(p + 1, 0))
                    .filter(|((_, d), _)| !(cfg.batching() && *d == 0))
                    .map(move |(&(_, d), &b)| (c.name.clone(), d, b))
            })
            .collect();
        Ok(AotiEngine {
            model,
            dims,
            sig: Signature { inputs, outputs, device: options.device },
            input_order,
            input_names,
            output_names,
            ranges,
            outputs_on_host: false,
        })
    }
}

impl Engine for AotiEngine {
    fn signature(&self) -> &Signature {
        &self.sig
    }
    fn accepts_device_inputs(&self) -> bool {
        true
    }
    fn outputs_landed(&mut self, on_host: bool) {
        self.outputs_on_host = on_host;
    }
    fn check_request(&self, inputs: &[RequestTensor<'_>]) -> Result<()> {
        check_dims(&self.dims, inputs)?;
        check_ranges(&self.ranges, inputs)
    }
    fn graph_input(
        &self,
        inputs: &[BatchTensor<'_>],
        name: &str,
    ) -> Option<triton_rust_core::tensor::DeviceViewMut<'static>> {
        let Device::Gpu(gpu) = self.sig.device else { return None };
        let index = self.input_names.iter().position(|n| n.to_str() == Ok(name))?;
        let t = &inputs[*self.input_order.get(index)?];
        let len = t.shape.iter().map(|&d| d.max(0) as usize).product::<usize>() * t.dtype.size()?;
        let refs = plugin::input_refs(inputs, &self.input_order, &self.input_names).ok()?;
        self.model.as_ref()?.graph_input(&refs, index, gpu, len)
    }

    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        let refs = plugin::input_refs(inputs, &self.input_order, &self.input_names)?;
        let host_outputs = self.sig.device == Device::Cpu || self.outputs_on_host;
        let names = &self.output_names;
        let model = self.model.as_mut().ok_or_else(|| {
            Error::internal("the load-time probe of an AOTInductor package cannot run")
        })?;
        model.run(&refs, names, host_outputs, &mut |out| {
            let name = names[out.index].to_str().unwrap_or_default();
            if name.is_empty() || !outputs.contains(&name) {
                return Ok(());
            }
            sink(OutputView { name, dtype: from_abi(out.dtype)?, shape: out.shape, data: out.data })
        })
    }
}

/// Under batching, every input's first dimension must be the package's dynamic batch, and
/// reach `max_batch_size`: a package exported with a static batch (no metadata says so, its
/// wrapper does) would fail every merged batch, and one exported for smaller batches than
/// the config asks would be run past its export.
fn check_batch_dims(
    cfg: &ModelConfig,
    package: &Package,
    in_pos: &[usize],
    inputs: &[TensorSpec],
) -> Result<()> {
    for (j, &p) in in_pos.iter().enumerate() {
        let Some(b) = package.dims.get(&(p, 0)) else { continue };
        let name = &inputs[j].name;
        if let Some(fixed) = b.fixed {
            return Err(Error::invalid_arg(format!(
                "max_batch_size {} asks for batching, but the package's input '{name}' was exported with a fixed first dimension of {fixed}: export it with a dynamic batch dimension (torch.export.Dim(\"batch\", max=N) on dimension 0 of every input; docs/pytorch2.md), or serve it with max_batch_size: 0",
                cfg.max_batch_size
            )));
        }
        if let Some(max) = b.max.filter(|&m| m < cfg.max_batch_size) {
            return Err(Error::invalid_arg(format!(
                "max_batch_size {} is larger than the batch the package's input '{name}' was exported for (at most {max}): set max_batch_size to at most {max}, or export with torch.export.Dim(\"batch\", max={})",
                cfg.max_batch_size, cfg.max_batch_size
            )));
        }
    }
    Ok(())
}

/// Every dimension of a request's input within the sizes the package was exported for:
/// past them the compiled code indexes out of bounds (a sequence longer than BERT's
/// position table), which on a CPU ends the process and on a GPU trips a device-side
/// assertion that poisons the GPU's context. `dims`: (input, dimension of the request's
/// shape, bounds); the batch dimension of a batching model is held by `max_batch_size`.
fn check_dims(dims: &[(String, usize, DimBounds)], inputs: &[RequestTensor<'_>]) -> Result<()> {
    for (name, d, bounds) in dims {
        let Some(t) = inputs.iter().find(|t| t.name == *name) else { continue };
        let Some(&size) = t.shape.get(*d) else { continue };
        if !bounds.admits(size) {
            return Err(Error::invalid_arg(format!(
                "input '{name}' has size {size} in dimension {d} (shape {:?}), and the package was exported for {} there",
                t.shape,
                bounds.describe()
            )));
        }
    }
    Ok(())
}

/// The first element of integer `bytes` (little-endian `dtype`) outside `[lo, hi)`: its
/// index and value.
fn first_outside(dtype: DataType, bytes: &[u8], (lo, hi): (i64, i64)) -> Option<(usize, i64)> {
    let size = dtype.size()?;
    let value = |c: &[u8]| -> Option<i64> {
        Some(match dtype {
            DataType::I8 => c[0] as i8 as i64,
            DataType::U8 => c[0] as i64,
            DataType::I16 => i16::from_le_bytes([c[0], c[1]]) as i64,
            DataType::I32 => i32::from_le_bytes(c.try_into().ok()?) as i64,
            DataType::I64 => i64::from_le_bytes(c.try_into().ok()?),
            _ => return None,
        })
    };
    bytes.chunks_exact(size).enumerate().find_map(|(i, c)| {
        let v = value(c)?;
        (v < lo || v >= hi).then_some((i, v))
    })
}

/// Inputs that index an embedding table hold only values it has rows for: an index past
/// the table fails inside the package's compiled kernel, and in a CPU package that check
/// throws inside an OpenMP region, which ends the process. Checked per request (the rest
/// of its batch is still answered) where the request holds the input in host memory; one
/// in GPU memory is not read back to be checked.
/// `ranges`: the range of each input, by name; inputs the request lacks (a recommender's
/// network gets its embeddings from the lookup, not the request) are not checked.
fn check_ranges(ranges: &[(String, (i64, i64))], inputs: &[RequestTensor<'_>]) -> Result<()> {
    for (name, range) in ranges {
        let range = *range;
        let Some(t) = inputs.iter().find(|t| t.name == *name) else { continue };
        let Some(bytes) = t.host_bytes() else { continue };
        if let Some((i, v)) = first_outside(t.dtype, &bytes, range) {
            return Err(Error::invalid_arg(format!(
                "input '{}' holds {v} at element {i}, outside [{}, {}): the model looks it up in a table of {} rows",
                t.name,
                range.0,
                range.1,
                range.1 - range.0
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use triton_rust_core::tensor::Bytes;

    fn t(name: &str, dims: &[i64]) -> TensorConfig {
        TensorConfig { name: name.into(), dtype: DataType::F32, dims: dims.to_vec(), reshape: None }
    }

    fn listed(name: &str, shape: &[i64]) -> TensorSpec {
        TensorSpec { name: name.into(), dtype: DataType::F16, shape: shape.to_vec() }
    }

    #[test]
    fn newer_packages_are_refused_older_ones_load_with_a_note() {
        let f = Path::new("m.pt2");
        assert!(check_release(None, "2.11.0", f).unwrap().is_none());
        assert!(check_release(Some("2.11.0"), "2.11.0", f).unwrap().is_none());
        let e = check_release(Some("2.99.0"), "2.11.0", f).unwrap_err();
        assert!(
            e.message().contains("made by torch 2.99.0") && e.message().contains("2.11.0"),
            "{e}"
        );
        assert!(check_release(Some("2.11.1"), "2.11.0", f).is_err());
        let note = check_release(Some("2.11.0"), "2.15.0", f).unwrap().unwrap();
        assert!(note.contains("2.11.0") && note.contains("2.15.0"));
        assert!(check_release(Some("2.14.0a0"), "2.15.0", f).unwrap().is_some());
    }

    #[test]
    fn the_release_of_the_runtime() {
        assert_eq!(runtime_release("libtorch 2.11.0 (AOTInductor, CUDA)"), "2.11.0");
        assert_eq!(runtime_release("libtorch 2.14.0a0+git123 (AOTInductor, CPU only)"), "2.14.0a0");
    }

    #[test]
    fn config_tensors_take_the_package_types_and_missing_ones_stay_visible() {
        let cfg = ModelConfig { max_batch_size: 8, ..Default::default() };
        let pkg = [listed("INPUT__0", &[-1, 13]), listed("INPUT__1", &[-1, 26, 128])];
        let (specs, pos) = tensors(
            &cfg,
            &[t("embeddings", &[26, 128]), t("dense", &[13])],
            Some(&pkg),
            None,
            true,
        )
        .unwrap();
        // names that say no position keep the config's order
        assert_eq!(pos, vec![0, 1]);
        assert_eq!((specs[0].name.as_str(), specs[0].dtype), ("embeddings", DataType::F16));
        assert_eq!(specs[0].shape, vec![-1, 13], "the package's shape, for the config check");
        let (specs, pos) =
            tensors(&cfg, &[t("INPUT__1", &[26, 128])], Some(&pkg), None, true).unwrap();
        assert_eq!(pos, vec![1]);
        assert_eq!(specs.len(), 2, "the unfed input stays in the signature");
        // auto-complete: the package's own tensors
        let (specs, _) = tensors(&cfg, &[], Some(&pkg), None, true).unwrap();
        assert_eq!(specs[1].name, "INPUT__1");
        let e = tensors(&cfg, &[], None, None, true).unwrap_err();
        assert!(e.message().contains("list every input and output"), "{e}");
        // a package without metadata: the config's tensors, batched
        let (specs, _) = tensors(&cfg, &[t("ARGS[0]", &[4])], None, None, true).unwrap();
        assert_eq!(specs[0].shape, vec![-1, 4]);
    }

    #[test]
    fn sizes_past_the_export_are_refused_naming_input_and_dimension() {
        let seq = DimBounds { min: Some(8), max: Some(128), fixed: None };
        let dims = vec![("INPUT__0".to_string(), 1, seq)];
        let ids = [0u8; 8 * 600];
        let req = |len: i64| RequestTensor {
            name: "INPUT__0".into(),
            dtype: DataType::I64,
            shape: vec![1, len],
            chunks: vec![Bytes::Host(&ids[..8 * len as usize])],
        };
        assert!(check_dims(&dims, &[req(8)]).is_ok());
        assert!(check_dims(&dims, &[req(128)]).is_ok());
        for len in [600, 7] {
            let e = check_dims(&dims, &[req(len)]).unwrap_err();
            assert_eq!(e.kind(), triton_rust_core::error::ErrorKind::InvalidArg);
            assert!(
                e.message().contains(&format!("input 'INPUT__0' has size {len} in dimension 1"))
                    && e.message().contains("exported for 8 to 128"),
                "{e}"
            );
        }
        // another input's bounds do not apply
        assert!(check_dims(&[("x".to_string(), 1, seq)], &[req(600)]).is_ok());
    }

    #[test]
    fn a_static_or_small_batch_is_refused_at_load_under_batching() {
        let cfg = ModelConfig { max_batch_size: 8, ..Default::default() };
        let mut package = Package::default();
        let inputs = [listed("INPUT__0", &[-1, 3])];
        assert!(check_batch_dims(&cfg, &package, &[0], &inputs).is_ok(), "nothing known");
        package.dims.insert((0, 0), DimBounds { fixed: Some(1), ..Default::default() });
        let e = check_batch_dims(&cfg, &package, &[0], &inputs).unwrap_err();
        assert!(
            e.message().contains("input 'INPUT__0' was exported with a fixed first dimension of 1"),
            "{e}"
        );
        package.dims.insert((0, 0), DimBounds { min: Some(1), max: Some(4), fixed: None });
        let e = check_batch_dims(&cfg, &package, &[0], &inputs).unwrap_err();
        assert!(
            e.message().contains("max_batch_size 8 is larger") && e.message().contains("at most 4"),
            "{e}"
        );
        package.dims.insert((0, 0), DimBounds { min: Some(1), max: Some(8), fixed: None });
        assert!(check_batch_dims(&cfg, &package, &[0], &inputs).is_ok());
    }

    #[test]
    fn values_outside_an_inputs_range_fail_its_request_only() {
        let ids: Vec<u8> = [3i64, 147, 148, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let seg: Vec<u8> = [0i32, 1, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
        fn req(bytes: &[u8], dtype: DataType) -> RequestTensor<'_> {
            RequestTensor {
                name: "INPUT__0".into(),
                dtype,
                shape: vec![1, (bytes.len() / dtype.size().unwrap()) as i64],
                chunks: vec![Bytes::Host(&bytes[..8]), Bytes::Host(&bytes[8..])],
            }
        }
        let one = |r: Option<(i64, i64)>| -> Vec<(String, (i64, i64))> {
            r.map(|r| ("INPUT__0".to_string(), r)).into_iter().collect()
        };
        let e = check_ranges(&one(Some((0, 148))), &[req(&ids, DataType::I64)]).unwrap_err();
        assert!(
            e.message().contains("input 'INPUT__0' holds 148 at element 2, outside [0, 148)"),
            "{e}"
        );
        assert!(check_ranges(&one(Some((0, 149))), &[req(&ids, DataType::I64)]).is_ok());
        assert!(check_ranges(&one(None), &[req(&ids, DataType::I64)]).is_ok());
        // by name: an input the request lacks is not checked, one in another place is
        let two = [("INPUT__1".to_string(), (0, 148)), ("INPUT__0".to_string(), (0, 148))];
        assert!(check_ranges(&two, &[req(&ids, DataType::I64)]).is_err());
        assert!(check_ranges(&two[..1], &[req(&ids, DataType::I64)]).is_ok());
        let e = check_ranges(&one(Some((0, 2))), &[req(&seg, DataType::I32)]).unwrap_err();
        assert!(e.message().contains("holds -1 at element 2"), "{e}");
        assert_eq!(first_outside(DataType::U8, &[0, 1, 2, 9], (0, 9)), Some((3, 9)));
        assert_eq!(first_outside(DataType::I16, &(-2i16).to_le_bytes(), (0, 9)), Some((0, -2)));
        assert_eq!(first_outside(DataType::F32, &1f32.to_le_bytes(), (0, 9)), None);
    }
}
