//! `json.dumps(x, ensure_ascii=False)` exactly as Python writes it: `", "` and `": "` separators
//! (or the `indent` layout), keys in insertion order, floats in Python's `repr`, no HTML escaping.
//! transformers' chat templates use this as `tojson`; minijinja's own filter differs.

use minijinja::value::{Value, ValueKind};

pub fn python_json_dumps(value: &Value, indent: Option<usize>) -> Result<String, minijinja::Error> {
    let mut out = String::new();
    write_value(&mut out, value, indent, 0)?;
    Ok(out)
}

fn newline(out: &mut String, indent: Option<usize>, level: usize) {
    if let Some(n) = indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * level));
    }
}

fn write_value(
    out: &mut String,
    v: &Value,
    indent: Option<usize>,
    level: usize,
) -> Result<(), minijinja::Error> {
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(i) = v.as_i64() {
                if !is_float(v) {
                    out.push_str(&i.to_string());
                    return Ok(());
                }
            }
            let f = f64::try_from(v.clone()).map_err(|_| {
                minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    "tojson: number out of range",
                )
            })?;
            out.push_str(&python_float_repr(f));
        }
        ValueKind::String => write_string(out, v.as_str().unwrap_or_default()),
        ValueKind::Bytes => write_string(out, &String::from_utf8_lossy(v.as_bytes().unwrap_or_default())),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, indent, level + 1);
                write_value(out, item, indent, level + 1)?;
            }
            newline(out, indent, level);
            out.push(']');
        }
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, indent, level + 1);
                match key.as_str() {
                    Some(s) => write_string(out, s),
                    None => write_string(out, &key.to_string()),
                }
                out.push_str(": ");
                write_value(out, &v.get_item(key)?, indent, level + 1)?;
            }
            newline(out, indent, level);
            out.push('}');
        }
        _ => write_string(out, &v.to_string()),
    }
    Ok(())
}

fn is_float(v: &Value) -> bool {
    // minijinja keeps f64 and integers apart; an integer-valued f64 still prints as `1.0`.
    matches!(
        serde_json::to_value(v),
        Ok(serde_json::Value::Number(n)) if n.is_f64()
    )
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: shortest round-trip digits, scientific below 1e-4 and from 1e16.
pub(crate) fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    let sci = format!("{f:e}"); // e.g. "-2.15e1", "1e-5"
    let (mantissa, exp) = sci.split_once('e').expect("exponent");
    let exp: i32 = exp.parse().expect("exponent digits");
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        };
        format!("{sign}{body}")
    } else {
        let frac = if digits.len() > 1 {
            format!(".{}", &digits[1..])
        } else {
            String::new()
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{}{frac}e{esign}{:02}", &digits[..1], exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python() {
        for (f, s) in [
            (1.0, "1.0"),
            (21.5, "21.5"),
            (0.5, "0.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789.0, "123456789.0"),
            (-2.25, "-2.25"),
            (0.1, "0.1"),
            (1.5e300, "1.5e+300"),
        ] {
            assert_eq!(python_float_repr(f), s);
        }
    }

    #[test]
    fn dumps_like_python() {
        let v =
            Value::from_serialize(serde_json::json!({"b": [1, 2.0, "x<y>&'"], "a": {"é": null, "t": true}}));
        assert_eq!(
            python_json_dumps(&v, None).unwrap(),
            r#"{"b": [1, 2.0, "x<y>&'"], "a": {"é": null, "t": true}}"#
        );
        assert_eq!(
            python_json_dumps(&v, Some(2)).unwrap(),
            "{\n  \"b\": [\n    1,\n    2.0,\n    \"x<y>&'\"\n  ],\n  \"a\": {\n    \"é\": null,\n    \"t\": true\n  }\n}"
        );
    }
}
