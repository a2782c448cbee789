//! Settings, read once at load into typed values.
//!
//! Each engine crate parses the model parameters it reads into one settings type of its
//! own (`OnnxSettings`, `TorchSettings`, the store's `StoreSettings`,
//! `RecommenderSettings`), and declares what it knows as [`Known`] rows (name, default as
//! the reference documents it, `docs/settings.md`). This module holds the core's own
//! per-model settings ([`CoreSettings`]), the backend's ([`BackendSettings`]: every
//! `--backend-config=rust,...` key and every environment variable the backend reads), and
//! the warning for a model parameter nobody knows ([`unknown_parameters`]).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::config::{ModelConfig, DEFAULT_MAX_BATCH_SIZE};
use crate::error::{Error, Result};

pub use crate::params::Known;

/// Model parameters Triton's own core reads (`EXECUTION_ENV_PATH`: a python-based
/// backend's environment, whose path Triton localizes); no warning for them.
pub const READ_BY_TRITON: &[&str] = &["EXECUTION_ENV_PATH"];

/// The core's own model parameters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CoreSettings {
    /// The engine named by `engine`, lower case; `None`: from the model file.
    pub engine: Option<String>,
    /// Reject NaN and Inf in float inputs.
    pub reject_nonfinite: bool,
    /// Integer inputs whose values must lie in `[lo, hi]`.
    pub valid_range: Vec<(String, i64, i64)>,
}

crate::parameters! {
    /// The core's model parameters, as config.pbtxt spells them.
    pub struct CoreParams {
        engine: Option<String> = None, doc "from the model file";
        reject_nonfinite: bool = false, doc "false";
        valid_range: Option<String> = None, doc "none";
    }
}

impl CoreSettings {
    pub const KNOWN: &'static [Known] = CoreParams::KNOWN;

    /// The engine the `engine` parameter names, lower case (read before the rest: it says
    /// which engine loads the model, and the rest is read once the config is complete).
    pub fn engine_named(config: &ModelConfig) -> Option<String> {
        config
            .parameters
            .get("engine")
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| !s.is_empty())
    }

    pub fn from_config(config: &ModelConfig) -> Result<CoreSettings> {
        #[cfg(test)]
        PARSED.with(|n| n.set(n.get() + 1));
        let p: CoreParams = crate::params::read(&config.parameters)?;
        let valid_range = match &p.valid_range {
            None => Vec::new(),
            Some(spec) => {
                let ranges = crate::batch::parse_valid_range(spec)?;
                if let Some((name, ..)) =
                    ranges.iter().find(|r| !config.inputs.iter().any(|c| c.name == r.0))
                {
                    return Err(Error::invalid_arg(format!(
                        "parameter 'valid_range' names '{name}', which is not an input of the model"
                    )));
                }
                ranges
            }
        };
        Ok(CoreSettings {
            engine: p.engine.map(|e| e.to_ascii_lowercase()),
            reject_nonfinite: p.reject_nonfinite,
            valid_range,
        })
    }
}

#[cfg(test)]
thread_local! {
    /// How many times this thread parsed a model's core settings (`settings_parsed_once`).
    pub(crate) static PARSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// `malloc-mmap-threshold` when not given.
pub const DEFAULT_MMAP_THRESHOLD: usize = 128 * 1024;

/// Where glibc's mmap threshold is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmapThreshold {
    /// glibc's own adaptive threshold.
    Adaptive,
    /// Fixed at this many bytes.
    Fixed(usize),
}

/// Backend-wide settings: `--backend-config=rust,<key>=<value>` and the environment, read
/// once when the backend starts and handed to whoever needs them.
#[derive(Debug, Clone)]
pub struct BackendSettings {
    /// Every key as given (for the start-up log line).
    pub cmdline: BTreeMap<String, String>,
    pub default_max_batch_size: i64,
    pub mmap_threshold: MmapThreshold,
    /// The environment variables the engines read (`EngineClaim::environment`), those set
    /// and not empty, as they were when the backend started.
    pub environment: BTreeMap<String, String>,
}

impl Default for BackendSettings {
    fn default() -> Self {
        BackendSettings {
            cmdline: BTreeMap::new(),
            default_max_batch_size: DEFAULT_MAX_BATCH_SIZE,
            mmap_threshold: MmapThreshold::Fixed(DEFAULT_MMAP_THRESHOLD),
            environment: BTreeMap::new(),
        }
    }
}

impl BackendSettings {
    /// The core's backend settings (Triton passes `default-max-batch-size` and
    /// `auto-complete-config` among them); each engine's are in its claim
    /// (`EngineClaim::backend_keys`).
    pub const KNOWN: &'static [Known] =
        &[("malloc-mmap-threshold", "131072"), ("default-max-batch-size", "4")];

    /// From Triton's backend config JSON and this process's environment (`environment`:
    /// the variables the engines read).
    pub fn from_json(json: &str, environment: &[&str]) -> Result<Self> {
        Self::parse(json, environment, |var| std::env::var(var).ok())
    }

    /// From the JSON and an environment given as a lookup.
    pub fn parse(
        json: &str,
        environment: &[&str],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        let v: Value = if json.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(json)
                .map_err(|e| Error::invalid_arg(format!("backend config is not JSON: {e}")))?
        };
        let mut cmdline = BTreeMap::new();
        if let Some(Value::Object(m)) = v.get("cmdline") {
            for (k, v) in m {
                cmdline.insert(
                    k.clone(),
                    v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()),
                );
            }
        }
        let default_max_batch_size = match cmdline.get("default-max-batch-size") {
            Some(s) => s.parse().map_err(|_| {
                Error::invalid_arg(format!("default-max-batch-size '{s}' is not an integer"))
            })?,
            None => DEFAULT_MAX_BATCH_SIZE,
        };
        let mmap_threshold = match cmdline.get("malloc-mmap-threshold").map(String::as_str) {
            Some("default") => MmapThreshold::Adaptive,
            None => MmapThreshold::Fixed(DEFAULT_MMAP_THRESHOLD),
            Some(s) => MmapThreshold::Fixed(s.parse().map_err(|_| {
                Error::invalid_arg(format!(
                    "malloc-mmap-threshold '{s}' is not a number of bytes or 'default'"
                ))
            })?),
        };
        let environment = environment
            .iter()
            .filter_map(|&var| Some((var.to_string(), env(var).filter(|v| !v.is_empty())?)))
            .collect();
        Ok(BackendSettings { cmdline, default_max_batch_size, mmap_threshold, environment })
    }

    /// The environment variable `var` as the backend found it at start (an engine's, listed
    /// in its claim), unless empty.
    pub fn env(&self, var: &str) -> Option<&str> {
        self.environment.get(var).map(String::as_str)
    }
}

/// Levenshtein distance, on characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != cb)).min(row[j] + 1).min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// The model's parameters that none of `known` names (nor Triton itself reads), each
/// with the closest known name when one is near enough to be a misspelling.
pub fn unknown_parameters<'k>(
    parameters: &BTreeMap<String, String>,
    known: &[&'k [Known]],
) -> Vec<(String, Option<&'k str>)> {
    let names = || known.iter().flat_map(|k| k.iter().map(|(n, _)| *n));
    parameters
        .keys()
        .filter(|key| !READ_BY_TRITON.contains(&key.as_str()))
        .filter(|key| !names().any(|n| n == key.as_str()))
        .map(|key| {
            let lower = key.to_ascii_lowercase();
            let closest = names()
                .map(|n| (edit_distance(&lower, &n.to_ascii_lowercase()), n))
                .min()
                .filter(|(d, n)| *d <= (n.len() / 3).max(2))
                .map(|(_, n)| n);
            (key.clone(), closest)
        })
        .collect()
}

/// Logs a warning for each of the model's parameters nobody knows.
pub fn warn_unknown_parameters(
    model: &str,
    parameters: &BTreeMap<String, String>,
    known: &[&[Known]],
) {
    for (key, closest) in unknown_parameters(parameters, known) {
        match closest {
            Some(near) => log::warn!(
                "model '{model}': parameter '{key}' is not known; did you mean '{near}'?"
            ),
            None => log::warn!("model '{model}': parameter '{key}' is not known; it is ignored"),
        }
    }
}

/// The rows of `docs/settings.md`'s tables: first cell a backticked name, second its
/// default (backticks dropped). For the tests that hold the reference to the code.
pub fn documented_defaults(markdown: &str) -> BTreeMap<String, String> {
    let mut rows = BTreeMap::new();
    for line in markdown.lines() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() < 3 {
            continue;
        }
        let Some(name) = cells[0].strip_prefix('`').and_then(|s| s.strip_suffix('`')) else {
            continue;
        };
        rows.insert(name.to_string(), cells[1].replace('`', ""));
    }
    rows
}

/// The (name, default) rows of the first table under the `## ` heading of `markdown` that
/// starts with `heading`, in order (backticks dropped from the default). For the tests that
/// hold a section of `docs/settings.md` equal to a settings type's `KNOWN`.
pub fn section_rows(markdown: &str, heading: &str) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let mut inside = false;
    for line in markdown.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            if inside {
                break;
            }
            inside = h.starts_with(heading);
            continue;
        }
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
        let name = cells.first().and_then(|c| c.strip_prefix('`')?.strip_suffix('`'));
        if let (true, Some(name), true) = (inside, name, cells.len() >= 3) {
            rows.push((name.to_string(), cells[1].replace('`', "")));
        }
    }
    rows
}

/// Whether `docs/settings.md`'s section under `heading` lists exactly `known`, in order:
/// `Err` says the first row that differs.
pub fn check_section(
    markdown: &str,
    heading: &str,
    known: &[Known],
) -> std::result::Result<(), String> {
    let doc = section_rows(markdown, heading);
    let code: Vec<(String, String)> =
        known.iter().map(|(n, d)| (n.to_string(), d.to_string())).collect();
    if doc == code {
        return Ok(());
    }
    let at = doc.iter().zip(&code).position(|(a, b)| a != b).unwrap_or(doc.len().min(code.len()));
    Err(format!(
        "docs/settings.md '## {heading}' row {}: the docs have {:?}, the code {:?}",
        at + 1,
        doc.get(at),
        code.get(at)
    ))
}

/// Each of `known` missing from `documented`, or documented with another default.
pub fn undocumented(known: &[Known], documented: &BTreeMap<String, String>) -> Vec<String> {
    known
        .iter()
        .filter_map(|(name, default)| match documented.get(*name) {
            None => Some(format!("'{name}' is not in docs/settings.md")),
            Some(d) if d != default => {
                Some(format!("'{name}': docs/settings.md says default '{d}', the code '{default}'"))
            }
            Some(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(keys: &[&str]) -> BTreeMap<String, String> {
        keys.iter().map(|k| (k.to_string(), "1".to_string())).collect()
    }

    #[test]
    fn a_misspelt_parameter_is_named_with_the_closest_known() {
        const ONNX: &[Known] = &[("intra_op_thread_count", ""), ("inter_op_thread_count", "")];
        let p = params(&["intra_op_thread_cont", "engine", "EXECUTION_ENV_PATH", "colour"]);
        let found = unknown_parameters(&p, &[CoreSettings::KNOWN, ONNX]);
        assert_eq!(
            found,
            vec![
                ("colour".to_string(), None),
                ("intra_op_thread_cont".to_string(), Some("intra_op_thread_count")),
            ]
        );
        // case differences count as near
        let found = unknown_parameters(&params(&["Reject_NonFinite"]), &[CoreSettings::KNOWN]);
        assert_eq!(found, vec![("Reject_NonFinite".to_string(), Some("reject_nonfinite"))]);
        assert!(unknown_parameters(&params(&["engine"]), &[CoreSettings::KNOWN]).is_empty());
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }

    #[test]
    fn backend_settings_typed_once() {
        let json = r#"{"cmdline":{"onnxruntime-library":"/x/ort.so","malloc-mmap-threshold":"default","node-name":""}}"#;
        let env =
            |v: &str| (v == "ORT_DYLIB_PATH" || v == "OTHER").then(|| "/e/ort.so".to_string());
        let s = BackendSettings::parse(json, &["ORT_DYLIB_PATH", "UNSET"], env).unwrap();
        // the engines read their keys from the command line as typed parameters
        assert_eq!(s.cmdline.get("onnxruntime-library").map(String::as_str), Some("/x/ort.so"));
        // only the variables the engines declare are read
        assert_eq!(
            (s.env("ORT_DYLIB_PATH"), s.env("UNSET"), s.env("OTHER")),
            (Some("/e/ort.so"), None, None)
        );
        assert_eq!(s.mmap_threshold, MmapThreshold::Adaptive);
        assert_eq!(s.default_max_batch_size, DEFAULT_MAX_BATCH_SIZE);
        let s = BackendSettings::parse("", &[], |_| None).unwrap();
        assert_eq!(s.mmap_threshold, MmapThreshold::Fixed(131072));
        let bad = r#"{"cmdline":{"malloc-mmap-threshold":"lots"}}"#;
        assert!(BackendSettings::parse(bad, &[], |_| None).is_err());
    }

    #[test]
    fn core_and_backend_defaults_are_the_documented_ones() {
        let md = include_str!("../../../docs/settings.md");
        check_section(md, "Every model", CoreSettings::KNOWN).unwrap();
        let doc = documented_defaults(md);
        let wrong = undocumented(BackendSettings::KNOWN, &doc);
        assert!(wrong.is_empty(), "{wrong:?}");
        assert_eq!(
            BackendSettings::KNOWN.iter().find(|k| k.0 == "malloc-mmap-threshold").unwrap().1,
            DEFAULT_MMAP_THRESHOLD.to_string()
        );
    }
}
