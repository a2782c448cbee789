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
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use triton_rust_abi::plugin::{self, from_abi, to_abi};
use triton_rust_core::batch::{BatchTensor, RequestTensor};
use triton_rust_core::config::{ModelConfig, TensorConfig, TensorSpec};
use triton_rust_core::engine::{
    Device, Engine, EngineClaim, LoadedModel, ModelLoad, OutputView, Signature,
};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::settings::Known;

mod checks;
pub mod names;
pub mod package;

use checks::{check_batch_dims, check_dims, check_ranges};

use package::{DimBounds, Package};

triton_rust_core::parameters! {
    /// The AOTInductor engine's model parameters (what a package needs is compiled into it).
    pub struct AotiParams {
        gpu_hand_over: Option<String> = None, doc "spin";
    }
}

/// The parameter a recommender sets on its network (`asleep`) when host threads read its
/// cache's misses; a TorchScript network reads it too.
pub use triton_rust_abi::plugin::HAND_OVER_PARAM;

/// The AOTInductor engine's model parameters.
pub const KNOWN: &[Known] = AotiParams::KNOWN;

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

/// PyTorch 2 packages: `model.pt2`, or a file ending in `.pt2`.
pub static CLAIM: EngineClaim = EngineClaim {
    names: &["aoti", "torch_aoti"],
    default_file: Some("model.pt2"),
    file_suffixes: &[".pt2"],
    parameters: KNOWN,
    backend_keys: AotiBackend::KNOWN,
    environment: &[plugin::LIBTORCH_ENV],
    builds_on: &[],
    keeps_sequences: true,
};

triton_rust_core::parameters! {
    /// The AOTInductor engine's backend setting (`--backend-config=rust,<key>=<value>`): the
    /// libtorch its plugin loads, as the TorchScript engine's.
    pub struct AotiBackend {
        #[serde(rename = "libtorch-dir")]
        libtorch_dir: Option<String> = None, doc "none";
    }
}

triton_rust_core::engine_kind!(
    /// The AOTInductor engine kind.
    AotiKind, CLAIM, AotiModel
);

/// A package, loaded: what it says of itself, the plugin, the signature. Each instance
/// loads the package on its device.
pub struct AotiModel {
    package: Package,
    plugin: Arc<plugin::Plugin>,
    model_file: PathBuf,
    /// Why a package made by another torch release may still load (named if it fails).
    across: Option<String>,
    sig: Signature,
    /// The final config, which every instance's package is loaded by.
    config: ModelConfig,
    /// Where the config's tensors sit in the package's flat order, and what requests are
    /// checked against: made by the first instance from the final config (and, for a
    /// package that does not list its tensors, the loaded package's call spec).
    layout: OnceLock<Arc<Layout>>,
    /// `gpu_hand_over`; None: the plugin's default (spinning).
    hand_over: Option<triton_rust_abi::worker::HandOver>,
}

/// The config's tensors in the package's flat order, and the bounds requests are checked against.
struct Layout {
    /// The config's inputs (their index in the signature's inputs) in the package's order.
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
}

impl AotiModel {
    /// The package's own tensors where it lists them (and the config's where it does not),
    /// read from its metadata; the package is kept for the load.
    pub fn describe(load: &ModelLoad<'_>) -> Result<Option<Signature>> {
        let (cfg, package) = (load.config, Package::read(load.model_file)?);
        let (inputs, _) = tensors(cfg, &cfg.inputs, package.inputs.as_deref(), None, true)?;
        let (outputs, _) = tensors(cfg, &cfg.outputs, package.outputs.as_deref(), None, false)?;
        load.opened.keep(package);
        Ok(Some(Signature { inputs, outputs }))
    }

    pub fn load(load: &ModelLoad<'_>) -> Result<AotiModel> {
        let (cfg, model_file) = (load.config, load.model_file);
        let package = match load.opened.take::<Package>() {
            Some(p) => p,
            None => Package::read(model_file)?,
        };
        let plugin = plugin::plugin(
            &plugin::AOTI,
            plugin::libtorch_dir(
                triton_rust_core::params::read::<AotiBackend>(&load.backend.cmdline)?
                    .libtorch_dir
                    .as_deref(),
                load.backend.env(plugin::LIBTORCH_ENV),
            )
            .as_ref()
            .map(|(d, source)| (d.as_path(), source.as_str())),
        )?;
        let params: AotiParams = triton_rust_core::params::read(&cfg.parameters)?;
        let hand_over = plugin::hand_over(params.gpu_hand_over.as_deref())?;
        let runs = runtime_release(plugin.runtime()).to_string();
        let made = package.torch_release().map(str::to_string);
        let across = check_release(made.as_deref(), &runs, model_file)?;
        if let Some(note) = &across {
            log::info!("model '{}': {note}", cfg.name);
        }
        for t in cfg.inputs.iter().chain(&cfg.outputs) {
            to_abi(t.dtype).map_err(|e| e.context(format!("tensor '{}'", t.name)))?;
        }
        let (inputs, in_pos) = tensors(cfg, &cfg.inputs, package.inputs.as_deref(), None, true)?;
        let (outputs, _) = tensors(cfg, &cfg.outputs, package.outputs.as_deref(), None, false)?;
        if cfg.batching() {
            check_batch_dims(cfg, &package, &in_pos, &inputs)?;
            if let Some(t) = inputs.iter().chain(&outputs).find(|t| t.shape.first() != Some(&-1)) {
                return Err(Error::invalid_arg(format!(
                    "max_batch_size {} asks for batching, but the package's tensor '{}' has shape {:?}, a fixed first dimension: export it with a dynamic batch dimension (torch.export.Dim(\"batch\") on dimension 0 of every input; examples/aoti_export.py), or serve it with max_batch_size: 0",
                    cfg.max_batch_size, t.name, t.shape
                )));
            }
        }
        Ok(AotiModel {
            package,
            plugin,
            model_file: model_file.to_path_buf(),
            across,
            sig: Signature { inputs, outputs },
            config: cfg.clone(),
            layout: OnceLock::new(),
            hand_over,
        })
    }

    /// The layout for the completed config `cfg`, with `model` (a loaded instance) to ask
    /// for the call spec when the package does not list its tensors.
    fn layout(&self, cfg: &ModelConfig, model: &plugin::PluginModel) -> Result<Layout> {
        let package = &self.package;
        let (inputs, mut in_pos) =
            tensors(cfg, &cfg.inputs, package.inputs.as_deref(), None, true)?;
        let (outputs, mut out_pos) =
            tensors(cfg, &cfg.outputs, package.outputs.as_deref(), None, false)?;
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
        Ok(Layout { input_order, input_names, output_names, ranges, dims })
    }
}

impl LoadedModel for AotiModel {
    fn signature(&self) -> &Signature {
        &self.sig
    }
    fn accepts_device_inputs(&self, _device: Device) -> bool {
        true
    }
    fn check_request(&self, inputs: &[RequestTensor<'_>]) -> Result<()> {
        let Some(layout) = self.layout.get() else { return Ok(()) };
        check_dims(&layout.dims, inputs)?;
        check_ranges(&layout.ranges, inputs)
    }
    fn instance(&self, device: Device) -> Result<Box<dyn Engine>> {
        Ok(Box::new(self.engine(device)?))
    }
}

impl AotiModel {
    /// The package loaded for an instance on `device`.
    pub fn engine(&self, device: Device) -> Result<AotiEngine> {
        let cfg = &self.config;
        let gpu = match device {
            Device::Gpu(id) => Some(id),
            Device::Cpu => None,
        };
        let buckets = cfg.cuda_graph_buckets()?;
        let model = self.plugin.load(&plugin::LoadSpec {
            path: &self.model_file,
            gpu,
            intra_op_threads: 0,
            cudnn: true,
            optimized_execution: true,
            tensor_fuser: None,
            jit_profiling: None,
            fusion_strategy: &[],
            cuda_graphs: if gpu.is_some() { buckets.as_deref() } else { None },
            graph_exact_rows: !cfg.batching(),
            hand_over: self.hand_over,
        });
        let model = match (model, &self.across) {
            (Err(e), Some(note)) => return Err(e.context(note.clone())),
            (m, _) => m?,
        };
        let layout = match self.layout.get() {
            Some(l) => l.clone(),
            None => {
                let l = Arc::new(self.layout(cfg, &model)?);
                self.layout.get_or_init(|| l).clone()
            }
        };
        Ok(AotiEngine { model, device, layout, outputs_on_host: false })
    }
}

/// One instance's package, loaded on its device.
pub struct AotiEngine {
    model: plugin::PluginModel,
    device: Device,
    layout: Arc<Layout>,
    outputs_on_host: bool,
}

impl AotiEngine {
    /// Where this instance's CUDA graph for a batch of `inputs` (as `run` would take them;
    /// their data unread) reads input `name`: that input's bytes for this batch in the
    /// graph's own GPU memory, for a caller to write and pass to `run` as that input, which
    /// then copies nothing for it. `None` when no graph already captured would run such a
    /// batch. The memory is the engine's: the view stays valid while the engine lives, and
    /// may be written only while none of its runs is in flight.
    pub fn graph_input(
        &self,
        inputs: &[BatchTensor<'_>],
        name: &str,
    ) -> Option<triton_rust_core::tensor::DeviceViewMut<'static>> {
        let Device::Gpu(gpu) = self.device else { return None };
        let l = &self.layout;
        let index = l.input_names.iter().position(|n| n.to_str() == Ok(name))?;
        let t = &inputs[*l.input_order.get(index)?];
        let len = t.shape.iter().map(|&d| d.max(0) as usize).product::<usize>() * t.dtype.size()?;
        let refs = plugin::input_refs(inputs, &l.input_order, &l.input_names).ok()?;
        self.model.graph_input(&refs, index, gpu, len)
    }
}

impl Engine for AotiEngine {
    fn outputs_landed(&mut self, on_host: bool) {
        self.outputs_on_host = on_host;
    }

    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        let l = &self.layout;
        let refs = plugin::input_refs(inputs, &l.input_order, &l.input_names)?;
        let host_outputs = self.device == Device::Cpu || self.outputs_on_host;
        let names = &l.output_names;
        self.model.run(&refs, names, host_outputs, &mut |out| {
            let name = names[out.index].to_str().unwrap_or_default();
            if name.is_empty() || !outputs.contains(&name) {
                return Ok(());
            }
            sink(OutputView { name, dtype: from_abi(out.dtype)?, shape: out.shape, data: out.data })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::first_outside;
    use triton_rust_core::tensor::Bytes;
    use triton_rust_core::tensor::DataType;

    fn t(name: &str, dims: &[i64]) -> TensorConfig {
        TensorConfig { name: name.into(), dtype: DataType::F32, dims: dims.to_vec(), reshape: None }
    }

    #[test]
    fn its_one_parameter_is_documented() {
        let doc = include_str!("../../../docs/settings.md");
        triton_rust_core::settings::check_section(doc, "AOTInductor engine", KNOWN).unwrap();
        assert_eq!(KNOWN.iter().map(|k| k.0).collect::<Vec<_>>(), [HAND_OVER_PARAM]);
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
