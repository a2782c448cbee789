//! Model parameters as types. Every value in `parameters` of config.pbtxt is a string; an
//! engine declares the ones it reads once, with [`parameters!`](crate::parameters): each
//! field's parameter name, type, default and the default as `docs/settings.md` writes it. The
//! macro makes a `#[derive(Deserialize)]` struct, its `Default` and its [`Known`] rows (what
//! the unknown-parameter warning and the docs test read), so nothing is written twice.
//! [`read`] parses the parameters into it, each value as its field's type, an error naming
//! the parameter, its value and what it takes.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, DeserializeOwned, IntoDeserializer, Visitor};

use crate::error::{Error, Result};

/// A setting a settings type reads: its name and its default, as `docs/settings.md`
/// writes it.
pub type Known = (&'static str, &'static str);

/// Declares a settings type read from model parameters:
///
/// ```ignore
/// triton_rust_core::parameters! {
///     /// The ONNX engine's parameters.
///     pub struct OnnxParams {
///         /// `1` runs independent nodes in parallel.
///         execution_mode: usize = 0, doc "0";
///         #[serde(rename = "DISABLE_CUDNN")]
///         disable_cudnn: bool = false, doc "false";
///     }
/// }
/// ```
///
/// Each field is `name: Type = default, doc "as docs/settings.md writes the default"`; the
/// parameter is the field's name, or its `#[serde(rename)]`. The struct gets `KNOWN`, its
/// rows in declaration order.
#[macro_export]
macro_rules! parameters {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[doc = $fdoc:literal])*
                $(#[serde(rename = $rename:literal)])?
                $field:ident : $ty:ty = $default:expr, doc $doc:literal;
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, serde::Deserialize)]
        #[serde(default)]
        pub struct $name {
            $(
                $(#[doc = $fdoc])*
                $(#[serde(rename = $rename)])?
                pub $field: $ty,
            )*
        }

        impl Default for $name {
            fn default() -> Self {
                $name { $($field: $default,)* }
            }
        }

        impl $name {
            /// Every parameter this type reads, and its default as the docs write it.
            pub const KNOWN: &'static [$crate::params::Known] = &[
                $(($crate::parameters!(@name $field $(, $rename)?), $doc),)*
            ];
        }
    };
    (@name $field:ident) => { stringify!($field) };
    (@name $field:ident, $rename:literal) => { $rename };
}

/// `parameters` read into `T` (a [`parameters!`](crate::parameters) type): each value parsed as
/// its field's type; parameters `T` does not declare are left to the other settings types. A
/// parameter given empty (or blank) counts as not given: its default holds.
pub fn read<T: DeserializeOwned>(parameters: &BTreeMap<String, String>) -> Result<T> {
    let given = parameters.iter().filter(|(_, v)| !v.trim().is_empty());
    let map = de::value::MapDeserializer::new(
        given.map(|(k, v)| (k.as_str(), Text { name: k, value: v })),
    );
    T::deserialize(map).map_err(|e: TextError| Error::invalid_arg(e.0))
}

/// A parameter read by its type's own parser (`FromStr`, whose error is the message): for the
/// types another crate owns and parses with errors of its own (the store's cache policies),
/// their defaults still declared beside the parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Parsed<T>(pub T);

impl<'de, T> serde::Deserialize<'de> for Parsed<T>
where
    T: std::str::FromStr,
    T::Err: fmt::Display,
{
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.trim().parse().map(Parsed).map_err(de::Error::custom)
    }
}

/// A parse error's text, already naming the parameter.
#[derive(Debug)]
pub struct TextError(String);

impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TextError {}

impl de::Error for TextError {
    fn custom<M: fmt::Display>(msg: M) -> Self {
        TextError(msg.to_string())
    }
    fn missing_field(field: &'static str) -> Self {
        TextError(format!("parameter '{field}' is required"))
    }
}

/// One parameter's text, parsed as whatever its field asks for.
struct Text<'a> {
    name: &'a str,
    value: &'a str,
}

impl Text<'_> {
    fn bad(&self, takes: &str) -> TextError {
        TextError(format!("parameter '{}' must be {takes}, got '{}'", self.name, self.value))
    }
    fn number<N: std::str::FromStr>(&self, takes: &str) -> std::result::Result<N, TextError> {
        self.value.trim().parse().map_err(|_| self.bad(takes))
    }
}

impl<'de> IntoDeserializer<'de, TextError> for Text<'de> {
    type Deserializer = Self;
    fn into_deserializer(self) -> Self {
        self
    }
}

macro_rules! numbers {
    ($($method:ident $visit:ident $t:ty, $takes:literal;)*) => {
        $(fn $method<V: Visitor<'de>>(self, v: V) -> std::result::Result<V::Value, TextError> {
            v.$visit(self.number::<$t>($takes)?)
        })*
    };
}

impl<'de> de::Deserializer<'de> for Text<'de> {
    type Error = TextError;

    /// Text as given, trimmed.
    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> std::result::Result<V::Value, TextError> {
        v.visit_borrowed_str(self.value.trim())
    }
    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> std::result::Result<V::Value, TextError> {
        match self.value.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => v.visit_bool(true),
            "false" | "0" | "no" | "off" => v.visit_bool(false),
            _ => Err(self.bad("true or false")),
        }
    }
    numbers! {
        deserialize_u8 visit_u8 u8, "a non-negative integer";
        deserialize_u16 visit_u16 u16, "a non-negative integer";
        deserialize_u32 visit_u32 u32, "a non-negative integer";
        deserialize_u64 visit_u64 u64, "a non-negative integer";
        deserialize_i8 visit_i8 i8, "an integer";
        deserialize_i16 visit_i16 i16, "an integer";
        deserialize_i32 visit_i32 i32, "an integer";
        deserialize_i64 visit_i64 i64, "an integer";
        deserialize_f32 visit_f32 f32, "a number";
        deserialize_f64 visit_f64 f64, "a number";
    }
    /// A parameter given is `Some`, even when empty.
    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> std::result::Result<V::Value, TextError> {
        v.visit_some(self)
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> std::result::Result<V::Value, TextError> {
        v.visit_newtype_struct(self)
    }
    /// A unit variant by its name (as `#[serde(rename_all)]` spells it), trimmed.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> std::result::Result<V::Value, TextError> {
        let value = self.value.trim();
        if !variants.contains(&value) {
            let (last, rest) = variants.split_last().unwrap_or((&"", &[]));
            let choices = if rest.is_empty() {
                last.to_string()
            } else {
                format!("{} or {last}", rest.join(", "))
            };
            return Err(TextError(format!(
                "parameter '{}' is '{}'; use {choices}",
                self.name, self.value
            )));
        }
        v.visit_enum(value.into_deserializer())
    }

    serde::forward_to_deserialize_any! {
        char str string bytes byte_buf unit unit_struct seq tuple tuple_struct map struct
        identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum Mode {
        Fast,
        Exact,
    }

    crate::parameters! {
        /// A settings type as an engine declares one.
        pub struct Sample {
            /// A count.
            threads: Option<usize> = None, doc "the runtime's";
            #[serde(rename = "DISABLE_THING")]
            disable_thing: bool = false, doc "false";
            ratio: f64 = 0.5, doc "0.5";
            mode: Mode = Mode::Exact, doc "exact";
            path: Option<String> = None, doc "none";
            level: Parsed<u8> = Parsed(3), doc "3";
        }
    }

    fn params(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn each_value_is_read_as_its_field_takes_it() {
        let s: Sample = read(&params(&[
            ("threads", " 4"),
            ("DISABLE_THING", "Yes"),
            ("ratio", "0.25"),
            ("mode", "fast"),
            ("path", "/x"),
            ("level", " 7"),
            ("someone_elses", "anything"),
        ]))
        .unwrap();
        let want = Sample {
            threads: Some(4),
            disable_thing: true,
            ratio: 0.25,
            mode: Mode::Fast,
            path: Some("/x".into()),
            level: Parsed(7),
        };
        assert_eq!(s, want);
        assert_eq!(read::<Sample>(&params(&[])).unwrap(), Sample::default());
        // given empty: as if not given
        assert_eq!(read::<Sample>(&params(&[("ratio", " ")])).unwrap(), Sample::default());
        assert_eq!(
            Sample::KNOWN,
            &[
                ("threads", "the runtime's"),
                ("DISABLE_THING", "false"),
                ("ratio", "0.5"),
                ("mode", "exact"),
                ("path", "none"),
                ("level", "3")
            ]
        );
    }

    #[test]
    fn a_bad_value_names_the_parameter_the_value_and_what_it_takes() {
        let err =
            |kv: &[(&str, &str)]| read::<Sample>(&params(kv)).unwrap_err().message().to_string();
        assert_eq!(
            err(&[("threads", "-1")]),
            "parameter 'threads' must be a non-negative integer, got '-1'"
        );
        assert_eq!(
            err(&[("DISABLE_THING", "maybe")]),
            "parameter 'DISABLE_THING' must be true or false, got 'maybe'"
        );
        assert_eq!(err(&[("ratio", "half")]), "parameter 'ratio' must be a number, got 'half'");
        // a type's own parser says what is wrong
        assert_eq!(err(&[("level", "x")]), "invalid digit found in string");
        assert_eq!(err(&[("mode", "quick")]), "parameter 'mode' is 'quick'; use fast or exact");
    }
}
