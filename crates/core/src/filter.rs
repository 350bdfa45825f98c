//! Metadata filters in the JSON style users know from Pinecone and Chroma:
//!
//! - `{"field": value}` — equality;
//! - `{"field": {"$eq"|"$ne"|"$in"|"$nin"|"$gt"|"$gte"|"$lt"|"$lte": …}}`;
//! - `{"$and": [f, …]}`, `{"$or": [f, …]}`, `{"$not": f}`;
//! - several keys in one object all have to hold.
//!
//! Values are numbers, strings or booleans. Strings that are RFC 3339 dates
//! compare as instants when both sides are dates. Fields may be dotted paths
//! into nested objects (`"source.year"`). A missing field never equals
//! anything, so `$ne` and `$nin` match documents without the field.

use serde_json::{Map, Value};
use std::cmp::Ordering;
use thiserror::Error;

/// A parse error, with the JSON path of the offending part (`filter.$and[1].year`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{path}: {message}")]
pub struct FilterError {
    pub path: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    Number(f64),
    String(String),
    /// An RFC 3339 date as milliseconds since the epoch (plus its text).
    Date(i64, String),
    Bool(bool),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub enum Filter {
    /// Matches everything.
    #[default]
    All,
    And(Vec<Filter>),
    Or(Vec<Filter>),
    Not(Box<Filter>),
    Cmp {
        field: String,
        op: Cmp,
        value: Scalar,
    },
    In {
        field: String,
        values: Vec<Scalar>,
        negate: bool,
    },
}

fn err(path: &str, message: impl Into<String>) -> FilterError {
    FilterError {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// Deepest a filter may nest (`$and`, `$or`, `$not`, a field's operators).
pub const MAX_DEPTH: usize = 32;
/// Most conditions and values one filter may hold (an `$in` list's values
/// each count): room for lists far past PostgreSQL's bind limit.
pub const MAX_TERMS: usize = 100_000;
/// Longest a filter may be, as JSON.
pub const MAX_BYTES: usize = 1024 * 1024;
/// Most conditions (a comparison, an `$in` or `$nin`) one filter may hold,
/// a condition on a dotted field counting once per part: what keeps the
/// database engine's statement within PostgreSQL's 65,535 parameters
/// (a condition binds at most six per part), so both engines answer the
/// same filters.
pub const MAX_CONDITIONS: usize = 10_000;

/// How deep `v` nests and how many leaves it holds, stopping once either
/// passes its bound.
fn size(v: &Value, depth: usize, terms: &mut usize, deepest: &mut usize) {
    *deepest = (*deepest).max(depth);
    if depth > MAX_DEPTH || *terms > MAX_TERMS {
        return;
    }
    match v {
        Value::Object(m) => m.values().for_each(|x| size(x, depth + 1, terms, deepest)),
        Value::Array(a) => a.iter().for_each(|x| size(x, depth + 1, terms, deepest)),
        _ => *terms += 1,
    }
}

impl Filter {
    /// Parses a filter; `root` names it in errors (e.g. `"filter"`). One
    /// past [`MAX_DEPTH`], [`MAX_TERMS`] or [`MAX_BYTES`] is refused
    /// before it is read, naming the bound.
    pub fn parse(value: &Value, root: &str) -> Result<Filter, FilterError> {
        let (mut terms, mut deepest) = (0, 0);
        size(value, 0, &mut terms, &mut deepest);
        if deepest > MAX_DEPTH {
            return Err(err(
                root,
                format!("nests deeper than the {MAX_DEPTH} levels a filter may have"),
            ));
        }
        if terms > MAX_TERMS {
            return Err(err(
                root,
                format!("holds more than the {MAX_TERMS} values a filter may have"),
            ));
        }
        let bytes = serde_json::to_vec(value).map_or(0, |b| b.len());
        if bytes > MAX_BYTES {
            return Err(err(
                root,
                format!("is {bytes} bytes of JSON, more than the {MAX_BYTES} a filter may have"),
            ));
        }
        let parsed = match value {
            Value::Null => Filter::All,
            Value::Object(map) => parse_object(map, root)?,
            _ => return Err(err(root, "must be an object")),
        };
        let conditions = parsed.conditions();
        if conditions > MAX_CONDITIONS {
            return Err(err(
                root,
                format!(
                    "holds {conditions} conditions, more than the {MAX_CONDITIONS} a filter may have \
                     (a dotted field counts once per part; a list of values in one $in is one)"
                ),
            ));
        }
        Ok(parsed)
    }

    /// Its conditions, as [`MAX_CONDITIONS`] counts them.
    fn conditions(&self) -> usize {
        match self {
            Filter::All => 0,
            Filter::And(fs) | Filter::Or(fs) => fs.iter().map(Filter::conditions).sum(),
            Filter::Not(f) => f.conditions(),
            Filter::Cmp { field, .. } | Filter::In { field, .. } => field.split('.').count(),
        }
    }

    /// Does a document with `metadata` pass?
    pub fn matches(&self, metadata: &Value) -> bool {
        self.matches_by(&|field| lookup(metadata, field))
    }

    /// Does a document pass whose field `f` (a key, or a dotted path into
    /// nested objects) holds `field(f)`? For metadata kept as something
    /// other than one JSON tree (a value per field, say): `field` finds a
    /// key as [`matches`](Self::matches) does — the key as written first,
    /// then the path's parts from the top.
    pub fn matches_by<'v>(&self, field: &dyn Fn(&str) -> Option<&'v Value>) -> bool {
        match self {
            Filter::All => true,
            Filter::And(fs) => fs.iter().all(|f| f.matches_by(field)),
            Filter::Or(fs) => fs.iter().any(|f| f.matches_by(field)),
            Filter::Not(f) => !f.matches_by(field),
            Filter::Cmp {
                field: name,
                op,
                value,
            } => {
                let Some(actual) = field(name) else {
                    return *op == Cmp::Ne;
                };
                // Arrays match when any element does (except $ne: none may).
                if let Value::Array(items) = actual {
                    return if *op == Cmp::Ne {
                        items
                            .iter()
                            .all(|v| compare(v, value) != Some(Ordering::Equal))
                    } else {
                        items.iter().any(|v| test(v, *op, value))
                    };
                }
                test(actual, *op, value)
            }
            Filter::In {
                field: name,
                values,
                negate,
            } => {
                let found = field(name).is_some_and(|actual| {
                    let hit = |v: &Value| {
                        values
                            .iter()
                            .any(|s| compare(v, s) == Some(Ordering::Equal))
                    };
                    match actual {
                        Value::Array(items) => items.iter().any(hit),
                        v => hit(v),
                    }
                });
                found != *negate
            }
        }
    }

    pub fn is_all(&self) -> bool {
        matches!(self, Filter::All)
    }
}

fn test(actual: &Value, op: Cmp, value: &Scalar) -> bool {
    let Some(ord) = compare(actual, value) else {
        return op == Cmp::Ne;
    };
    match op {
        Cmp::Eq => ord == Ordering::Equal,
        Cmp::Ne => ord != Ordering::Equal,
        Cmp::Gt => ord == Ordering::Greater,
        Cmp::Gte => ord != Ordering::Less,
        Cmp::Lt => ord == Ordering::Less,
        Cmp::Lte => ord != Ordering::Greater,
    }
}

/// Orders a metadata value against a filter value; `None` when the types
/// cannot be compared.
fn compare(actual: &Value, want: &Scalar) -> Option<Ordering> {
    match (actual, want) {
        (Value::Number(n), Scalar::Number(w)) => n.as_f64()?.partial_cmp(w),
        (Value::Bool(b), Scalar::Bool(w)) => Some(b.cmp(w)),
        (Value::String(s), Scalar::Date(w, _)) => parse_rfc3339(s).map(|ms| ms.cmp(w)),
        (Value::String(s), Scalar::String(w)) => Some(s.as_str().cmp(w.as_str())),
        _ => None,
    }
}

fn lookup<'a>(metadata: &'a Value, field: &str) -> Option<&'a Value> {
    if let Some(v) = metadata.get(field) {
        return Some(v);
    }
    let mut cur = metadata;
    for part in field.split('.') {
        cur = cur.get(part)?;
    }
    Some(cur)
}

fn scalar(v: &Value, path: &str) -> Result<Scalar, FilterError> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .map(Scalar::Number)
            .ok_or_else(|| err(path, "number out of range")),
        Value::String(s) => Ok(match parse_rfc3339(s) {
            Some(ms) => Scalar::Date(ms, s.clone()),
            None => Scalar::String(s.clone()),
        }),
        Value::Bool(b) => Ok(Scalar::Bool(*b)),
        _ => Err(err(path, "must be a number, a string or a boolean")),
    }
}

fn parse_object(map: &Map<String, Value>, path: &str) -> Result<Filter, FilterError> {
    if map.is_empty() {
        return Ok(Filter::All);
    }
    let mut parts = Vec::with_capacity(map.len());
    for (key, v) in map {
        let p = format!("{path}.{key}");
        let f = match key.as_str() {
            "$and" | "$or" => {
                let Value::Array(items) = v else {
                    return Err(err(&p, "must be an array of filters"));
                };
                if items.is_empty() {
                    return Err(err(&p, "must not be empty"));
                }
                let fs = items
                    .iter()
                    .enumerate()
                    .map(|(i, f)| match f {
                        Value::Object(m) => parse_object(m, &format!("{p}[{i}]")),
                        _ => Err(err(&format!("{p}[{i}]"), "must be an object")),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if key == "$and" {
                    Filter::And(fs)
                } else {
                    Filter::Or(fs)
                }
            }
            "$not" => match v {
                Value::Object(m) => Filter::Not(Box::new(parse_object(m, &p)?)),
                _ => return Err(err(&p, "must be an object")),
            },
            k if k.starts_with('$') => {
                return Err(err(
                    &p,
                    format!("unknown operator {k:?}; use $and, $or or $not here"),
                ));
            }
            "" => return Err(err(&p, "field name must not be empty")),
            field => parse_field(field, v, &p)?,
        };
        parts.push(f);
    }
    Ok(if parts.len() == 1 {
        parts.remove(0)
    } else {
        Filter::And(parts)
    })
}

fn parse_field(field: &str, v: &Value, path: &str) -> Result<Filter, FilterError> {
    let Value::Object(ops) = v else {
        return Ok(Filter::Cmp {
            field: field.to_owned(),
            op: Cmp::Eq,
            value: scalar(v, path)?,
        });
    };
    if ops.is_empty() {
        return Err(err(path, "must name an operator such as $eq"));
    }
    let mut parts = Vec::with_capacity(ops.len());
    for (op, arg) in ops {
        let p = format!("{path}.{op}");
        let cmp = match op.as_str() {
            "$eq" => Cmp::Eq,
            "$ne" => Cmp::Ne,
            "$gt" => Cmp::Gt,
            "$gte" => Cmp::Gte,
            "$lt" => Cmp::Lt,
            "$lte" => Cmp::Lte,
            "$in" | "$nin" => {
                let Value::Array(items) = arg else {
                    return Err(err(&p, "must be an array"));
                };
                let values = items
                    .iter()
                    .enumerate()
                    .map(|(i, x)| scalar(x, &format!("{p}[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                parts.push(Filter::In {
                    field: field.to_owned(),
                    values,
                    negate: op == "$nin",
                });
                continue;
            }
            other => {
                return Err(err(
                    &p,
                    format!(
                        "unknown operator {other:?}; use $eq, $ne, $in, $nin, $gt, $gte, $lt or $lte"
                    ),
                ));
            }
        };
        let value = scalar(arg, &p)?;
        if matches!(cmp, Cmp::Gt | Cmp::Gte | Cmp::Lt | Cmp::Lte)
            && matches!(value, Scalar::Bool(_))
        {
            return Err(err(&p, "cannot order booleans"));
        }
        parts.push(Filter::Cmp {
            field: field.to_owned(),
            op: cmp,
            value,
        });
    }
    Ok(if parts.len() == 1 {
        parts.remove(0)
    } else {
        Filter::And(parts)
    })
}

/// Parses an RFC 3339 date-time (`2024-05-01T12:00:00Z`,
/// `2024-05-01T12:00:00.5+02:00`) or a full date (`2024-05-01`, taken as
/// midnight UTC) into milliseconds since the epoch.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().ok()
        } else {
            None
        }
    };
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    let (mut h, mut mi, mut sec, mut ms, mut offset_min) = (0, 0, 0, 0i64, 0i64);
    if b.len() > 10 {
        if !matches!(b[10], b'T' | b't' | b' ') || b.len() < 20 || b[13] != b':' || b[16] != b':' {
            return None;
        }
        h = num(11..13)?;
        mi = num(14..16)?;
        sec = num(17..19)?;
        if h > 23 || mi > 59 || sec > 60 {
            return None;
        }
        let mut i = 19;
        if b.get(i) == Some(&b'.') {
            let start = i + 1;
            i = start;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i == start {
                return None;
            }
            let frac = &s[start..i.min(start + 3)];
            ms = frac.parse::<i64>().ok()? * 10i64.pow(3 - frac.len() as u32);
        }
        match b.get(i) {
            Some(b'Z' | b'z') if i + 1 == b.len() => {}
            Some(sign @ (b'+' | b'-')) if b.len() == i + 6 && b[i + 3] == b':' => {
                let off = num(i + 1..i + 3)? * 60 + num(i + 4..i + 6)?;
                offset_min = if *sign == b'+' { off } else { -off };
            }
            _ => return None,
        }
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + h) * 60 + mi - offset_min) * 60_000 + sec * 1000 + ms)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_filter_past_its_bounds_is_refused_naming_the_bound() {
        use super::*;
        let mut deep = serde_json::json!({"a": 1});
        for _ in 0..40 {
            deep = serde_json::json!({"$not": deep});
        }
        let e = Filter::parse(&deep, "filter").expect_err("too deep");
        assert_eq!(e.path, "filter");
        assert!(e.message.contains("32 levels"), "{e}");
        let many: Vec<i64> = (0..(MAX_TERMS as i64 + 1)).collect();
        let e = Filter::parse(&serde_json::json!({"id": {"$in": many}}), "filter")
            .expect_err("too many");
        assert!(e.message.contains("100000 values"), "{e}");
        let long = "x".repeat(MAX_BYTES);
        let e = Filter::parse(&serde_json::json!({"id": long}), "filter").expect_err("too long");
        assert!(e.message.contains("bytes of JSON"), "{e}");
        let or = |n: usize, field: &str| {
            let any: Vec<Value> = (0..n).map(|i| serde_json::json!({field: i})).collect();
            serde_json::json!({"$or": any})
        };
        let e = Filter::parse(&or(MAX_CONDITIONS + 1, "id"), "filter").expect_err("too many");
        assert_eq!(e.path, "filter");
        assert!(e.message.contains("10001 conditions"), "{e}");
        assert!(Filter::parse(&or(MAX_CONDITIONS, "id"), "filter").is_ok());
        let e = Filter::parse(&or(MAX_CONDITIONS / 2 + 1, "a.b"), "filter");
        assert!(e.is_err(), "a dotted field counts once per part");
        // 20,000 values (past PostgreSQL's bind limit) are a filter.
        let big: Vec<i64> = (0..20_000).collect();
        let f = Filter::parse(&serde_json::json!({"id": {"$in": big}}), "filter");
        assert!(f.is_ok_and(|f| f.matches(&serde_json::json!({"id": 19_999}))));
    }

    use super::*;
    use serde_json::json;

    fn f(v: Value) -> Filter {
        Filter::parse(&v, "filter").unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn equality_comparison_and_membership() {
        let m = json!({"year": 2020, "lang": "en", "peer_reviewed": true, "tags": ["bio", "cell"]});
        assert!(f(json!({"year": 2020})).matches(&m));
        assert!(!f(json!({"year": 2021})).matches(&m));
        assert!(f(json!({"lang": "en", "peer_reviewed": true})).matches(&m));
        assert!(!f(json!({"lang": "en", "peer_reviewed": false})).matches(&m));
        assert!(f(json!({"year": {"$gte": 2020, "$lt": 2021}})).matches(&m));
        assert!(!f(json!({"year": {"$gt": 2020}})).matches(&m));
        assert!(f(json!({"year": {"$lte": 2020.0}})).matches(&m));
        assert!(f(json!({"lang": {"$in": ["de", "en"]}})).matches(&m));
        assert!(!f(json!({"lang": {"$nin": ["de", "en"]}})).matches(&m));
        assert!(f(json!({"lang": {"$ne": "de"}})).matches(&m));
        assert!(
            f(json!({"tags": "cell"})).matches(&m),
            "arrays match any element"
        );
        assert!(f(json!({"tags": {"$in": ["x", "bio"]}})).matches(&m));
        assert!(!f(json!({"tags": {"$ne": "bio"}})).matches(&m));
        // Type mismatch never matches (but $ne does).
        assert!(!f(json!({"year": "2020"})).matches(&m));
        assert!(f(json!({"year": {"$ne": "2020"}})).matches(&m));
    }

    #[test]
    fn missing_fields_match_only_negations() {
        let m = json!({"a": 1});
        assert!(!f(json!({"b": 1})).matches(&m));
        assert!(f(json!({"b": {"$ne": 1}})).matches(&m));
        assert!(f(json!({"b": {"$nin": [1]}})).matches(&m));
        assert!(!f(json!({"b": {"$gt": 0}})).matches(&m));
    }

    #[test]
    fn logical_operators_and_nested_fields() {
        let m = json!({"source": {"year": 2019, "venue": "nature"}, "lang": "en"});
        assert!(f(json!({"source.year": 2019})).matches(&m));
        assert!(f(json!({"$or": [{"lang": "de"}, {"source.venue": "nature"}]})).matches(&m));
        assert!(!f(json!({"$and": [{"lang": "de"}, {"source.venue": "nature"}]})).matches(&m));
        assert!(f(json!({"$not": {"lang": "de"}})).matches(&m));
        assert!(!f(json!({"$not": {"$or": [{"lang": "en"}, {"x": 1}]}})).matches(&m));
        assert!(f(json!({})).matches(&m));
        assert!(Filter::parse(&Value::Null, "filter").is_ok_and(|x| x.is_all()));
    }

    #[test]
    fn dates_compare_as_instants() {
        let m = json!({"published": "2024-05-01T12:00:00+02:00"});
        assert!(f(json!({"published": {"$gt": "2024-05-01T09:59:59Z"}})).matches(&m));
        assert!(!f(json!({"published": {"$gt": "2024-05-01T10:00:00Z"}})).matches(&m));
        assert!(f(json!({"published": {"$eq": "2024-05-01T10:00:00.000Z"}})).matches(&m));
        assert!(f(json!({"published": {"$gte": "2024-05-01", "$lt": "2024-05-02"}})).matches(&m));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2000-03-01T00:00:00Z"), Some(951_868_800_000));
        assert_eq!(parse_rfc3339("2024-13-01"), None);
        assert_eq!(parse_rfc3339("not a date"), None);
        assert_eq!(
            parse_rfc3339("2024-05-01T12:00:00"),
            None,
            "an offset is required"
        );
    }

    #[test]
    fn malformed_filters_name_the_offending_path() {
        let e = |v: Value| {
            Filter::parse(&v, "filter")
                .err()
                .map(|e| e.path)
                .unwrap_or_default()
        };
        assert_eq!(e(json!([1])), "filter");
        assert_eq!(
            e(json!({"year": {"$between": [1, 2]}})),
            "filter.year.$between"
        );
        assert_eq!(e(json!({"$and": [{"a": 1}, 5]})), "filter.$and[1]");
        assert_eq!(e(json!({"$and": []})), "filter.$and");
        assert_eq!(e(json!({"$xor": []})), "filter.$xor");
        assert_eq!(e(json!({"a": {"$in": "x"}})), "filter.a.$in");
        assert_eq!(e(json!({"a": {"$in": [[1]]}})), "filter.a.$in[0]");
        assert_eq!(e(json!({"a": null})), "filter.a");
        assert_eq!(e(json!({"a": {"$gt": true}})), "filter.a.$gt");
        assert_eq!(e(json!({"a": {}})), "filter.a");
    }
}
