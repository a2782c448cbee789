//! Which of a package's flat inputs (outputs) a config tensor is, by its name.
//!
//! A package takes its arguments flattened in torch.export's order (positional
//! arguments, then keyword arguments) and returns its results flattened. Names, as
//! Triton's PyTorch backend spells them: `INPUT__i` / `OUTPUT__i` (any name ending in
//! `__i`) and `ARGS[i]` / `RESULT[i]` are position `i`; `KWARGS[k]` is keyword argument
//! `k` and `RESULT[k]` entry `k` of a dict result, found through the package's call
//! spec (torch's serialized pytree specs). A name the package's own metadata lists is
//! its position there. Names that say nothing of a position keep the config's order.

use serde_json::Value;
use triton_rust_core::error::{Error, Result};

#[derive(Debug, PartialEq, Eq)]
pub enum Slot {
    Position(usize),
    Key(String),
}

/// What a name says of its position, if anything.
pub fn slot(name: &str) -> Option<Slot> {
    // the bracket forms first: a key may hold `__` (`KWARGS[a__b]`)
    let inner = |prefix: &str| name.strip_prefix(prefix).and_then(|r| r.strip_suffix(']'));
    if let Some(i) = inner("ARGS[") {
        return i.parse().ok().map(Slot::Position);
    }
    if let Some(k) = inner("KWARGS[") {
        return Some(Slot::Key(k.to_string()));
    }
    if let Some(r) = inner("RESULT[") {
        return Some(match r.parse() {
            Ok(i) => Slot::Position(i),
            Err(_) => Slot::Key(r.to_string()),
        });
    }
    let (_, i) = name.rsplit_once("__")?;
    i.parse().ok().map(Slot::Position)
}

/// A serialized pytree spec (`[protocol, tree]`): its tree.
fn tree(spec: &str) -> Result<Value> {
    let v: Value = serde_json::from_str(spec)
        .map_err(|e| Error::invalid_arg(format!("the package's call spec is not JSON: {e}")))?;
    Ok(match v {
        Value::Array(mut parts) if parts.len() == 2 => parts.remove(1),
        other => other,
    })
}

fn children(node: &Value) -> &[Value] {
    node["children_spec"].as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// How many tensors a subtree flattens to.
fn leaves(node: &Value) -> usize {
    let c = children(node);
    if c.is_empty() {
        usize::from(node["type"].is_null())
    } else {
        c.iter().map(leaves).sum()
    }
}

/// A dict node's keys (its `context`, itself JSON text of a list).
fn keys(node: &Value) -> Vec<String> {
    let list: Vec<Value> =
        node["context"].as_str().and_then(|c| serde_json::from_str(c).ok()).unwrap_or_default();
    list.iter().map(|k| k.as_str().map_or_else(|| k.to_string(), str::to_string)).collect()
}

/// The flat position of entry `key` of dict `node`, counted from `base`.
fn key_position(node: &Value, key: &str, base: usize) -> Option<usize> {
    let i = keys(node).iter().position(|k| k == key)?;
    Some(base + children(node)[..i].iter().map(leaves).sum::<usize>())
}

/// The flat position of keyword argument `key` (the input spec is `(args, kwargs)`).
pub fn kwarg_position(in_spec: &str, key: &str) -> Result<Option<usize>> {
    let root = tree(in_spec)?;
    let [args, kwargs] = children(&root) else { return Ok(None) };
    Ok(key_position(kwargs, key, leaves(args)))
}

/// The flat position of entry `key` of a dict result.
pub fn result_key_position(out_spec: &str, key: &str) -> Result<Option<usize>> {
    Ok(key_position(&tree(out_spec)?, key, 0))
}

/// The flat positions of the config's tensors `names`. `listed`: the names the package's
/// metadata gives its flat tensors, if it does; `spec`: the part of the call spec to
/// resolve keys with (inputs: the input spec, outputs: the output spec), if known yet;
/// `None` for a key then means "not known yet" and the config's order is used, unless the
/// package lists its names: those are all it has, so a key they lack is an error.
/// Two tensors at one position are an error.
pub fn positions(
    names: &[&str],
    listed: Option<&[String]>,
    spec: Option<&str>,
    inputs: bool,
) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(names.len());
    let mut unplaced = Vec::new();
    for &name in names {
        if let Some(i) = listed.and_then(|l| l.iter().position(|n| n == name)) {
            out.push(Some(i));
            continue;
        }
        let pos = match slot(name) {
            Some(Slot::Position(i)) => Some(i),
            Some(Slot::Key(k)) => match spec {
                None if listed.is_some() => {
                    return Err(Error::invalid_arg(format!(
                        "tensor '{name}': the package names its {} {:?}, and no {} named '{k}'",
                        if inputs { "inputs" } else { "outputs" },
                        listed.unwrap_or_default(),
                        if inputs { "keyword argument" } else { "result entry" }
                    )))
                }
                None => return Ok((0..names.len()).collect()),
                Some(s) => {
                    let found =
                        if inputs { kwarg_position(s, &k)? } else { result_key_position(s, &k)? };
                    Some(found.ok_or_else(|| {
                        Error::invalid_arg(format!(
                            "tensor '{name}': the package's call spec has no {} named '{k}'",
                            if inputs { "keyword argument" } else { "result entry" }
                        ))
                    })?)
                }
            },
            None => None,
        };
        if pos.is_none() {
            unplaced.push(name);
        }
        out.push(pos);
    }
    if unplaced.len() == names.len() {
        return Ok((0..names.len()).collect());
    }
    if let Some(name) = unplaced.first() {
        return Err(Error::invalid_arg(format!(
            "tensor '{name}' names no position of the package's {}: use INPUT__i/OUTPUT__i, ARGS[i], KWARGS[name] or RESULT[i|key], or the names the package lists",
            if inputs { "inputs" } else { "outputs" }
        )));
    }
    let out: Vec<usize> = out.into_iter().map(|p| p.unwrap_or(0)).collect();
    for (j, p) in out.iter().enumerate() {
        if let Some(i) = out[..j].iter().position(|q| q == p) {
            return Err(Error::invalid_arg(format!(
                "tensors '{}' and '{}' are both the package's {} {p}: name each once",
                names[i],
                names[j],
                if inputs { "input" } else { "output" }
            )));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // torch 2.11's spec of f(x, y, *, scale, bias) -> {"a": .., "b": (.., ..)}
    const IN: &str = r#"[1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": "builtins.tuple", "context": "null", "children_spec": [{"type": null, "context": null, "children_spec": []}, {"type": null, "context": null, "children_spec": []}]}, {"type": "builtins.dict", "context": "[\"scale\", \"bias\"]", "children_spec": [{"type": null, "context": null, "children_spec": []}, {"type": null, "context": null, "children_spec": []}]}]}]"#;
    const OUT: &str = r#"[1, {"type": "builtins.dict", "context": "[\"a\", \"b\"]", "children_spec": [{"type": null, "context": null, "children_spec": []}, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": null, "context": null, "children_spec": []}, {"type": null, "context": null, "children_spec": []}]}]}]"#;

    #[test]
    fn names_say_positions_or_keys() {
        assert_eq!(slot("INPUT__2"), Some(Slot::Position(2)));
        assert_eq!(slot("ARGS[1]"), Some(Slot::Position(1)));
        assert_eq!(slot("KWARGS[scale]"), Some(Slot::Key("scale".into())));
        assert_eq!(slot("RESULT[0]"), Some(Slot::Position(0)));
        assert_eq!(slot("RESULT[logits]"), Some(Slot::Key("logits".into())));
        assert_eq!(slot("dense"), None);
        assert_eq!(slot("KWARGS[a__b]"), Some(Slot::Key("a__b".into())));
        assert_eq!(slot("RESULT[x__1]"), Some(Slot::Key("x__1".into())));
    }

    #[test]
    fn a_key_the_listed_names_lack_is_an_error_not_the_config_order() {
        let listed: Vec<String> =
            ["ARGS[0]", "KWARGS[bias]", "KWARGS[scale]"].iter().map(|s| s.to_string()).collect();
        let ok =
            positions(&["KWARGS[scale]", "ARGS[0]", "KWARGS[bias]"], Some(&listed), None, true);
        assert_eq!(ok.unwrap(), vec![2, 0, 1]);
        let typo =
            positions(&["KWARGS[scale]", "ARGS[0]", "KWARGS[sacle]"], Some(&listed), None, true);
        let e = typo.unwrap_err();
        assert!(e.message().contains("'KWARGS[sacle]'") && e.message().contains("'sacle'"), "{e}");
    }

    #[test]
    fn two_tensors_at_one_position_are_an_error() {
        let e = positions(&["OUTPUT__0", "RESULT[0]"], None, None, false).unwrap_err();
        assert!(e.message().contains("'OUTPUT__0' and 'RESULT[0]'"), "{e}");
        let listed = vec!["INPUT__0".to_string()];
        assert!(positions(&["INPUT__0", "ARGS[0]"], Some(&listed), None, true).is_err());
    }

    #[test]
    fn keys_resolve_through_the_call_spec() {
        assert_eq!(kwarg_position(IN, "bias").unwrap(), Some(3));
        assert_eq!(kwarg_position(IN, "scale").unwrap(), Some(2));
        assert_eq!(kwarg_position(IN, "nope").unwrap(), None);
        assert_eq!(result_key_position(OUT, "b").unwrap(), Some(1));
        let p = positions(
            &["KWARGS[bias]", "ARGS[0]", "ARGS[1]", "KWARGS[scale]"],
            None,
            Some(IN),
            true,
        );
        assert_eq!(p.unwrap(), vec![3, 0, 1, 2]);
        // before the spec is known: the config's order
        assert_eq!(positions(&["KWARGS[bias]", "ARGS[0]"], None, None, true).unwrap(), vec![0, 1]);
        let e = positions(&["KWARGS[gain]"], None, Some(IN), true).unwrap_err();
        assert!(e.message().contains("no keyword argument named 'gain'"), "{e}");
    }

    #[test]
    fn listed_names_then_positions_then_config_order() {
        let listed = vec!["INPUT__0".to_string(), "INPUT__1".to_string()];
        assert_eq!(
            positions(&["INPUT__1", "INPUT__0"], Some(&listed), None, true).unwrap(),
            vec![1, 0]
        );
        assert_eq!(
            positions(&["dense", "embeddings"], Some(&listed), None, true).unwrap(),
            vec![0, 1]
        );
        let e = positions(&["INPUT__0", "mask"], None, None, true).unwrap_err();
        assert!(e.message().contains("'mask'"), "{e}");
    }
}
