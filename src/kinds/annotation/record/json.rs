//! The leader record's JSON object as written: its top-level members in
//! order, keys decoded and values verbatim (duplicates kept), and a value
//! written again without whitespace. What [`super::parse`] reads fields
//! from and [`super::released`] copies the other fields with, byte for byte.

use serde_json::Value;

use super::{quote, type_name, RecordError, MAX_LEN};

/// One top-level member of a JSON object, as written.
pub(super) struct Member<'a> {
    /// The key, decoded.
    pub(super) key: String,
    /// The key as written, quotes and escapes included.
    pub(super) raw_key: &'a str,
    /// The value as written.
    pub(super) value: &'a str,
}

/// The members of the JSON object `value`, in order, duplicates kept; `None`
/// for an empty (or whitespace only) value.
pub(super) fn object(value: &str) -> Result<Option<Vec<Member<'_>>>, RecordError> {
    if value.len() > MAX_LEN {
        return Err(RecordError::TooLarge { len: value.len() });
    }
    if value.trim().is_empty() {
        return Ok(None);
    }
    // serde_json says whether it is JSON at all (its depth limit keeps a
    // deeply nested value from overflowing the stack); the scan below then
    // only walks a valid document.
    let whole: Value = serde_json::from_str(value).map_err(|e| RecordError::NotJson {
        why: e.to_string(),
        value: quote(value),
    })?;
    if !whole.is_object() {
        return Err(RecordError::NotAnObject {
            found: type_name(&whole),
            value: quote(value),
        });
    }
    members(value)
        .map(Some)
        .ok_or_else(|| RecordError::NotJson {
            why: "its object could not be walked".into(),
            value: quote(value),
        })
}

/// The members of a valid JSON object, by scanning its text; `None` only if
/// the text is not one after all.
fn members(s: &str) -> Option<Vec<Member<'_>>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some(out);
    }
    loop {
        let key_end = string_end(b, i)?;
        let raw_key = s.get(i..key_end)?;
        let key: String = serde_json::from_str(raw_key).ok()?;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let value_end = value_end(b, i)?;
        out.push(Member {
            key,
            raw_key,
            value: s.get(i..value_end)?,
        });
        i = skip_ws(b, value_end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return Some(out),
            _ => return None,
        }
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// The index just past the string that starts (with `"`) at `i`.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    loop {
        match b.get(j)? {
            b'"' => return Some(j + 1),
            b'\\' => j += 2,
            _ => j += 1,
        }
    }
}

/// The index just past the value that starts at `i`.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match b.get(j)? {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let mut j = i;
            while !matches!(
                b.get(j),
                None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            ) {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

/// Appends the valid JSON `v` to `out` without whitespace outside strings.
pub(super) fn compact_into(v: &str, out: &mut String) {
    let mut in_string = false;
    let mut escaped = false;
    for c in v.chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
        } else if matches!(c, ' ' | '\t' | '\n' | '\r') {
            continue;
        }
        out.push(c);
    }
}
