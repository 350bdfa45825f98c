//! The metadata filter language ([`Filter`]) compiled to a PostgreSQL
//! condition over a document's metadata as `jsonb`, for the database
//! engine. The contract is exactness: a document passes the SQL condition
//! if and only if [`Filter::matches`] passes it, so a search answers the
//! same set on either engine (the shared filter suite runs both). Hence
//! the care below, mirrored from `ragtime_core::filter`:
//!
//! - a field is the key as written, or else a dotted path through nested
//!   objects (`->` with text keys, which like the Rust lookup never index
//!   an array);
//! - a comparison of values of different types is false, except `$ne`;
//!   every cast sits behind a `CASE` on the value's JSON type, because SQL
//!   does not promise to evaluate `AND`'s sides in order;
//! - an array matches when any element does (`$ne`: when none equals);
//! - strings compare by bytes (`COLLATE "C"`, as Rust's `str` order);
//!   RFC 3339 dates compare as instants through `ragtime_rfc3339_ms`, a
//!   SQL copy of [`ragtime_core::filter::parse_rfc3339`] made with the
//!   engine's schema ([`RFC3339_FUNCTION`]).
//!
//! Values travel as bound parameters, never as SQL text.

use ragtime_core::filter::{Cmp, Filter, Scalar};

/// A value bound to a compiled condition's placeholder.
#[derive(Debug, Clone, PartialEq)]
pub enum Bind {
    Text(String),
    Float(f64),
    Bool(bool),
    Int(i64),
}

/// A condition and its parameters, numbered from the `first` the caller
/// gave [`compile`].
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub sql: String,
    pub binds: Vec<Bind>,
}

/// Compiles `filter` over the `jsonb` expression `meta`; placeholders
/// start at `$first`.
pub fn compile(filter: &Filter, meta: &str, first: usize) -> Condition {
    let mut c = Compiler {
        meta,
        next: first,
        binds: Vec::new(),
    };
    let sql = c.filter(filter);
    Condition {
        sql,
        binds: c.binds,
    }
}

struct Compiler<'a> {
    meta: &'a str,
    next: usize,
    binds: Vec<Bind>,
}

impl Compiler<'_> {
    fn bind(&mut self, b: Bind) -> String {
        self.binds.push(b);
        self.next += 1;
        format!("${}", self.next - 1)
    }

    fn filter(&mut self, f: &Filter) -> String {
        match f {
            Filter::All => "TRUE".to_owned(),
            Filter::And(fs) => self.join(fs, " AND "),
            Filter::Or(fs) => self.join(fs, " OR "),
            Filter::Not(f) => format!("(NOT {})", self.filter(f)),
            Filter::Cmp { field, op, value } => self.cmp(field, *op, value),
            Filter::In {
                field,
                values,
                negate,
            } => self.member(field, values, *negate),
        }
    }

    fn join(&mut self, fs: &[Filter], op: &str) -> String {
        let parts: Vec<String> = fs.iter().map(|f| self.filter(f)).collect();
        format!("({})", parts.join(op))
    }

    /// The field's value, or SQL NULL when it is missing: the key as
    /// written, else the dotted path.
    fn lookup(&mut self, field: &str) -> String {
        let meta = self.meta;
        let whole = format!("({meta} -> {}::text)", self.bind(Bind::Text(field.into())));
        if !field.contains('.') {
            return whole;
        }
        let mut path = format!("({meta}");
        for part in field.split('.') {
            path.push_str(&format!(" -> {}::text", self.bind(Bind::Text(part.into()))));
        }
        path.push(')');
        format!("COALESCE({whole}, {path})")
    }

    fn cmp(&mut self, field: &str, op: Cmp, value: &Scalar) -> String {
        let x = self.lookup(field);
        let missing = sql_bool(op == Cmp::Ne);
        let array = if op == Cmp::Ne {
            let eq = self.test("e.v", Cmp::Eq, value);
            format!("NOT EXISTS (SELECT 1 FROM jsonb_array_elements({x}) e(v) WHERE {eq})")
        } else {
            let t = self.test("e.v", op, value);
            format!("EXISTS (SELECT 1 FROM jsonb_array_elements({x}) e(v) WHERE {t})")
        };
        let single = self.test(&x, op, value);
        format!(
            "(CASE WHEN {x} IS NULL THEN {missing} WHEN jsonb_typeof({x}) = 'array' THEN {array} ELSE {single} END)"
        )
    }

    fn member(&mut self, field: &str, values: &[Scalar], negate: bool) -> String {
        let x = self.lookup(field);
        let hit = |c: &mut Self, v: &str| -> String {
            if values.is_empty() {
                return "FALSE".to_owned();
            }
            let parts: Vec<String> = values.iter().map(|s| c.test(v, Cmp::Eq, s)).collect();
            format!("({})", parts.join(" OR "))
        };
        let in_array = hit(self, "e.v");
        let single = hit(self, &x);
        let found = format!(
            "(CASE WHEN {x} IS NULL THEN FALSE WHEN jsonb_typeof({x}) = 'array' \
             THEN EXISTS (SELECT 1 FROM jsonb_array_elements({x}) e(v) WHERE {in_array}) \
             ELSE {single} END)"
        );
        if negate {
            format!("(NOT {found})")
        } else {
            found
        }
    }

    /// One value `v` (not an array) against `value`: values of another
    /// type are unordered, which only `$ne` passes.
    fn test(&mut self, v: &str, op: Cmp, value: &Scalar) -> String {
        let (guard, lhs, rhs) = match value {
            Scalar::Number(n) => (
                format!("jsonb_typeof({v}) = 'number'"),
                format!("({v} #>> '{{}}')::float8"),
                format!("{}::float8", self.bind(Bind::Float(*n))),
            ),
            Scalar::Bool(b) => (
                format!("jsonb_typeof({v}) = 'boolean'"),
                format!("({v} #>> '{{}}')::boolean"),
                format!("{}::boolean", self.bind(Bind::Bool(*b))),
            ),
            Scalar::String(s) => (
                format!("jsonb_typeof({v}) = 'string'"),
                format!("(({v} #>> '{{}}') COLLATE \"C\")"),
                format!("({}::text COLLATE \"C\")", self.bind(Bind::Text(s.clone()))),
            ),
            Scalar::Date(ms, _) => (
                format!(
                    "jsonb_typeof({v}) = 'string' AND ragtime_rfc3339_ms({v} #>> '{{}}') IS NOT NULL"
                ),
                format!("ragtime_rfc3339_ms({v} #>> '{{}}')"),
                format!("{}::bigint", self.bind(Bind::Int(*ms))),
            ),
        };
        let sql_op = match op {
            Cmp::Eq => "=",
            Cmp::Ne => "<>",
            Cmp::Gt => ">",
            Cmp::Gte => ">=",
            Cmp::Lt => "<",
            Cmp::Lte => "<=",
        };
        let otherwise = sql_bool(op == Cmp::Ne);
        format!("(CASE WHEN {guard} THEN {lhs} {sql_op} {rhs} ELSE {otherwise} END)")
    }
}

/// Magnitudes below this are integers an `f64` holds exactly.
const EXACT_INTEGERS: f64 = 9_007_199_254_740_992.0;

/// A condition that an index on `meta` (GIN, `jsonb_path_ops`) can answer
/// and that every document passing `filter` passes too (a superset), so
/// `index AND exact` selects what the exact condition selects, from the
/// index's few rows instead of every document's metadata. `None` where no
/// such condition is known: a range, a negation, a date (equal instants
/// are written in many ways), a dotted path (the key as written or the
/// nested object), and a number of 2^53 or more.
///
/// An equality `{"f": v}` passes when the value is `v` or an array holding
/// it, so it reads `meta @> {"f": v} OR meta @> {"f": [v]}`. Strings and
/// booleans are equal in `jsonb` exactly when they are in Rust. Numbers:
/// the filter language compares `f64`s; stored metadata is written by
/// `serde_json` (the shortest decimal that reads back as its `f64`, or
/// an integer), and `jsonb` compares decimals by value, so below 2^53 a
/// stored number equals `v` as a decimal exactly when it does as an `f64`.
pub fn index_condition(filter: &Filter, meta: &str, first: usize) -> Option<Condition> {
    let mut c = Compiler {
        meta,
        next: first,
        binds: Vec::new(),
    };
    let sql = c.contains(filter)?;
    Some(Condition {
        sql,
        binds: c.binds,
    })
}

impl Compiler<'_> {
    fn contains(&mut self, f: &Filter) -> Option<String> {
        match f {
            Filter::Cmp {
                field,
                op: Cmp::Eq,
                value,
            } => self.holds(field, std::slice::from_ref(value)),
            Filter::In {
                field,
                values,
                negate: false,
            } => self.holds(field, values),
            // Each part that has one narrows the rows; the rest are left
            // to the exact condition.
            Filter::And(fs) => {
                let parts: Vec<String> = fs.iter().filter_map(|f| self.attempt(f)).collect();
                (!parts.is_empty()).then(|| format!("({})", parts.join(" AND ")))
            }
            // Every branch needs one, or the rows of the one without it
            // would be missed.
            Filter::Or(fs) if !fs.is_empty() => {
                let parts: Option<Vec<String>> = fs.iter().map(|f| self.contains(f)).collect();
                parts.map(|p| format!("({})", p.join(" OR ")))
            }
            _ => None,
        }
    }

    /// [`Self::contains`], binding nothing when it has no condition (a part
    /// of an `$and` that fails half-way leaves no unused parameters).
    fn attempt(&mut self, f: &Filter) -> Option<String> {
        let (next, bound) = (self.next, self.binds.len());
        let found = self.contains(f);
        if found.is_none() {
            self.next = next;
            self.binds.truncate(bound);
        }
        found
    }

    /// `meta` holds `field` equal to one of `values`, or an array with one.
    fn holds(&mut self, field: &str, values: &[Scalar]) -> Option<String> {
        if field.contains('.') || values.is_empty() {
            return None;
        }
        let mut parts = Vec::new();
        for v in values {
            let json = match v {
                Scalar::String(s) => serde_json::Value::from(s.as_str()),
                Scalar::Bool(b) => serde_json::Value::from(*b),
                Scalar::Number(n) if n.abs() < EXACT_INTEGERS => serde_json::Value::from(*n),
                Scalar::Number(_) | Scalar::Date(..) => return None,
            };
            for shape in [json.clone(), serde_json::Value::Array(vec![json])] {
                let mut object = serde_json::Map::new();
                object.insert(field.to_owned(), shape);
                let p = self.bind(Bind::Text(serde_json::Value::Object(object).to_string()));
                parts.push(format!("{} @> {p}::text::jsonb", self.meta));
            }
        }
        Some(format!("({})", parts.join(" OR ")))
    }
}

fn sql_bool(b: bool) -> &'static str {
    if b { "TRUE" } else { "FALSE" }
}

/// `ragtime_rfc3339_ms(text)`: milliseconds since the epoch of an RFC 3339
/// date-time or full date, NULL when the text is not one — the same rules
/// and arithmetic as `parse_rfc3339` (days from civil, no calendar check
/// beyond the ranges it checks), with no cast that could raise an error.
pub const RFC3339_FUNCTION: &str = r#"
CREATE OR REPLACE FUNCTION ragtime_rfc3339_ms(s text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    m text[];
    y bigint; mo bigint; d bigint;
    h bigint := 0; mi bigint := 0; sec bigint := 0; ms bigint := 0; off bigint := 0;
    y2 bigint; era bigint; yoe bigint; mp bigint; doy bigint; doe bigint; days bigint;
BEGIN
    m := regexp_match(s, '^([0-9]{4})-([0-9]{2})-([0-9]{2})(?:[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2})))?$');
    IF m IS NULL THEN RETURN NULL; END IF;
    y := m[1]::bigint; mo := m[2]::bigint; d := m[3]::bigint;
    IF mo < 1 OR mo > 12 OR d < 1 OR d > 31 THEN RETURN NULL; END IF;
    IF m[4] IS NOT NULL THEN
        h := m[4]::bigint; mi := m[5]::bigint; sec := m[6]::bigint;
        IF h > 23 OR mi > 59 OR sec > 60 THEN RETURN NULL; END IF;
        IF m[7] IS NOT NULL THEN ms := rpad(left(m[7], 3), 3, '0')::bigint; END IF;
        IF m[9] IS NOT NULL THEN
            off := m[10]::bigint * 60 + m[11]::bigint;
            IF m[9] = '-' THEN off := -off; END IF;
        END IF;
    END IF;
    y2 := CASE WHEN mo <= 2 THEN y - 1 ELSE y END;
    era := CASE WHEN y2 >= 0 THEN y2 / 400 ELSE (y2 - 399) / 400 END;
    yoe := y2 - era * 400;
    mp := (mo + 9) % 12;
    doy := (153 * mp + 2) / 5 + d - 1;
    doe := yoe * 365 + yoe / 4 - yoe / 100 + doy;
    days := era * 146097 + doe - 719468;
    RETURN ((days * 24 + h) * 60 + mi - off) * 60000 + sec * 1000 + ms;
END
$fn$"#;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_are_bound_never_spliced_and_numbered_from_first() {
        let f = Filter::parse(&json!({"a.b": {"$in": ["x'); DROP TABLE t; --", 2]}}), "f")
            .expect("parse");
        let c = compile(&f, "d.meta", 4);
        assert!(!c.sql.contains("DROP"), "{}", c.sql);
        assert!(c.sql.contains("$4") && !c.sql.contains("$3"), "{}", c.sql);
        // The whole key and its two parts, then the two values for an
        // array's elements and again for a single value.
        assert_eq!(c.binds.len(), 7, "{:?}", c.binds);
        assert_eq!(
            c.binds[..3],
            [
                Bind::Text("a.b".into()),
                Bind::Text("a".into()),
                Bind::Text("b".into())
            ]
        );
        for i in [3, 5] {
            assert_eq!(c.binds[i], Bind::Text("x'); DROP TABLE t; --".into()));
            assert_eq!(c.binds[i + 1], Bind::Float(2.0));
        }
    }

    #[test]
    fn a_plain_key_is_looked_up_once_and_everything_matches_true() {
        let c = compile(&Filter::All, "m", 1);
        assert_eq!(c.sql, "TRUE");
        let f = Filter::parse(&json!({"lang": "en"}), "f").expect("parse");
        let c = compile(&f, "m", 1);
        assert!(!c.sql.contains("COALESCE"), "{}", c.sql);
    }

    #[test]
    fn an_index_condition_is_a_containment_only_where_it_holds_every_match() {
        let cond =
            |v: serde_json::Value| index_condition(&Filter::parse(&v, "f").expect("parse"), "m", 1);
        let c = cond(json!({"lang": "en", "year": {"$gte": 2020}})).expect("the equality");
        assert_eq!(c.sql, "((m @> $1::text::jsonb OR m @> $2::text::jsonb))");
        assert_eq!(
            c.binds,
            [
                Bind::Text(r#"{"lang":"en"}"#.into()),
                Bind::Text(r#"{"lang":["en"]}"#.into())
            ]
        );
        let c = cond(json!({"n": {"$in": [3, true]}})).expect("the members");
        assert_eq!(c.binds.len(), 4, "{:?}", c.binds);
        assert_eq!(c.binds[0], Bind::Text(r#"{"n":3.0}"#.into()));
        assert!(cond(json!({"$or": [{"a": 1}, {"b": 2}]})).is_some());
        // A part without one binds nothing.
        let c = cond(json!({"$and": [
            {"$or": [{"lang": "de"}, {"year": {"$gt": 1}}]},
            {"n": {"$in": [1, "2024-05-01"]}},
            {"ok": true}
        ]}))
        .expect("the boolean");
        assert_eq!(c.sql, "((m @> $1::text::jsonb OR m @> $2::text::jsonb))");
        assert_eq!(c.binds.len(), 2, "{:?}", c.binds);
        for none in [
            json!({"year": {"$gte": 2020}}),
            json!({"lang": {"$ne": "en"}}),
            json!({"lang": {"$nin": ["en"]}}),
            json!({"$not": {"lang": "en"}}),
            json!({"$or": [{"lang": "en"}, {"year": {"$lt": 3}}]}),
            json!({"at": "2024-05-01"}),
            json!({"source.year": 2019}),
            json!({"n": 9_007_199_254_740_993_u64}),
        ] {
            assert!(cond(none.clone()).is_none(), "{none}");
        }
    }
}
