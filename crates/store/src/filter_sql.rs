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
    /// An `$in` list's values of one type, as one array parameter: a list
    /// of any length binds a few parameters, never one per value (a
    /// statement takes at most 65535).
    Texts(Vec<String>),
    Floats(Vec<f64>),
    Bools(Vec<bool>),
    Ints(Vec<i64>),
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
        document: None,
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
    /// The document's id and collection, for [`index_condition`]'s ranges.
    document: Option<&'a Documents<'a>>,
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
        let in_array = self.any_of("e.v", values);
        let single = self.any_of(&x, values);
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

    /// One value `v` (not an array) equal to one of `values`: the `OR` of
    /// [`Self::test`]'s equalities, as one `= ANY` over an array of each
    /// type's values (the same guard and the same cast for every value of
    /// a type, so the same answer).
    fn any_of(&mut self, v: &str, values: &[Scalar]) -> String {
        let (mut texts, mut floats, mut bools, mut ints) = (vec![], vec![], vec![], vec![]);
        for value in values {
            match value {
                Scalar::String(s) => texts.push(s.clone()),
                Scalar::Number(n) => floats.push(*n),
                Scalar::Bool(b) => bools.push(*b),
                Scalar::Date(ms, _) => ints.push(*ms),
            }
        }
        let groups = [
            (
                texts.len(),
                Bind::Texts(texts),
                Scalar::String(String::new()),
            ),
            (floats.len(), Bind::Floats(floats), Scalar::Number(0.0)),
            (bools.len(), Bind::Bools(bools), Scalar::Bool(false)),
            (ints.len(), Bind::Ints(ints), Scalar::Date(0, String::new())),
        ];
        let mut parts = Vec::new();
        for (n, bind, kind) in groups {
            if n == 0 {
                continue;
            }
            let (guard, lhs, ty) = typed(v, &kind);
            let p = self.bind(bind);
            parts.push(format!(
                "(CASE WHEN {guard} THEN {lhs} = ANY ({p}::{ty}[]) ELSE FALSE END)"
            ));
        }
        if parts.is_empty() {
            return "FALSE".to_owned();
        }
        format!("({})", parts.join(" OR "))
    }

    /// One value `v` (not an array) against `value`: values of another
    /// type are unordered, which only `$ne` passes.
    fn test(&mut self, v: &str, op: Cmp, value: &Scalar) -> String {
        let (guard, lhs, ty) = typed(v, value);
        let rhs = match value {
            Scalar::Number(n) => format!("{}::{ty}", self.bind(Bind::Float(*n))),
            Scalar::Bool(b) => format!("{}::{ty}", self.bind(Bind::Bool(*b))),
            Scalar::String(s) => {
                format!("({}::{ty} COLLATE \"C\")", self.bind(Bind::Text(s.clone())))
            }
            Scalar::Date(ms, _) => format!("{}::{ty}", self.bind(Bind::Int(*ms))),
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

/// How a value `v` (not an array) of `value`'s type is told and read:
/// the guard on its JSON type, the value as SQL, and the SQL type a value
/// of that type binds as.
fn typed(v: &str, value: &Scalar) -> (String, String, &'static str) {
    match value {
        Scalar::Number(_) => (
            format!("jsonb_typeof({v}) = 'number'"),
            format!("({v} #>> '{{}}')::float8"),
            "float8",
        ),
        Scalar::Bool(_) => (
            format!("jsonb_typeof({v}) = 'boolean'"),
            format!("({v} #>> '{{}}')::boolean"),
            "boolean",
        ),
        Scalar::String(_) => (
            format!("jsonb_typeof({v}) = 'string'"),
            format!("(({v} #>> '{{}}') COLLATE \"C\")"),
            "text",
        ),
        Scalar::Date(..) => (
            format!(
                "jsonb_typeof({v}) = 'string' AND ragtime_rfc3339_ms({v} #>> '{{}}') IS NOT NULL"
            ),
            format!("ragtime_rfc3339_ms({v} #>> '{{}}')"),
            "bigint",
        ),
    }
}

/// Past this many `@>` tests (two per `$in` value), an `$in`'s index
/// condition binds its values as one array.
const HOLDS_MAX_SHAPES: usize = 512;

/// Magnitudes below this are integers an `f64` holds exactly.
const EXACT_INTEGERS: f64 = 9_007_199_254_740_992.0;

/// Where [`index_condition`] finds a document: SQL for its metadata as
/// `jsonb`, its id, and the collection searched (a placeholder).
#[derive(Debug, Clone, Copy)]
pub struct Documents<'a> {
    pub meta: &'a str,
    pub id: &'a str,
    pub collection: &'a str,
}

/// A condition that an index can answer and that every document passing
/// `filter` passes too (a superset), so `index AND exact` selects what the
/// exact condition selects, from the index's few rows instead of every
/// document's metadata. `None` where no such condition is known: a
/// negation, a string range, an equality on a date (equal instants are
/// written in many ways), a dotted path (the key as written or the nested
/// object), and an equality on a number of 2^53 or more.
///
/// An equality `{"f": v}` passes when the value is `v` or an array holding
/// it, so it reads `meta @> {"f": v} OR meta @> {"f": [v]}` (GIN,
/// `jsonb_path_ops`). Strings and booleans are equal in `jsonb` exactly
/// when they are in Rust. Numbers: the filter language compares `f64`s;
/// stored metadata is written by `serde_json` (the shortest decimal that
/// reads back as its `f64`, or an integer), and `jsonb` compares decimals
/// by value, so below 2^53 a stored number equals `v` as a decimal exactly
/// when it does as an `f64`.
///
/// A range on a number or a date reads `document_values`
/// ([`DOCUMENT_VALUES`]): every number and RFC 3339 date under a
/// top-level key, and in an array there, as the `float8` the exact
/// condition compares (a date as its milliseconds, which a `float8` holds
/// exactly), B-tree indexed by collection, key, kind and value. A document
/// passes `{"f": {"$gt": x}}` when its value, or one element, is past `x`,
/// so the rows past `x` hold every one. Bounds on one key under `$and`
/// read one range, not two: a single value passes both bounds only if it
/// lies between them, but an array passes when one element passes each,
/// so the documents with an array under the key are added whole.
pub fn index_condition(filter: &Filter, on: &Documents<'_>, first: usize) -> Option<Condition> {
    let mut c = Compiler {
        meta: on.meta,
        document: Some(on),
        next: first,
        binds: Vec::new(),
    };
    let sql = c.contains(filter)?;
    Some(Condition {
        sql,
        binds: c.binds,
    })
}

/// A bound of a range filter on one key: `value op bound`.
struct Bound {
    op: &'static str,
    value: f64,
}

/// The range `f` reads in `document_values`: its key, the kind of value
/// (`n` a number, `d` a date) and its bound; `None` for anything else.
fn range(f: &Filter) -> Option<(&str, char, Bound)> {
    let Filter::Cmp { field, op, value } = f else {
        return None;
    };
    let op = match op {
        Cmp::Gt => ">",
        Cmp::Gte => ">=",
        Cmp::Lt => "<",
        Cmp::Lte => "<=",
        Cmp::Eq | Cmp::Ne => return None,
    };
    let (kind, value) = match value {
        Scalar::Number(n) => ('n', *n),
        // Milliseconds within years 0–9999 are far below 2^53.
        Scalar::Date(ms, _) => ('d', *ms as f64),
        Scalar::String(_) | Scalar::Bool(_) => return None,
    };
    (!field.contains('.') && value.is_finite()).then_some((
        field.as_str(),
        kind,
        Bound { op, value },
    ))
}

impl Compiler<'_> {
    fn contains(&mut self, f: &Filter) -> Option<String> {
        match f {
            Filter::Cmp {
                field,
                op: Cmp::Eq,
                value,
            } => self.holds(field, std::slice::from_ref(value)),
            Filter::Cmp { .. } => {
                let (field, kind, bound) = range(f)?;
                self.values(field, kind, &[bound])
            }
            Filter::In {
                field,
                values,
                negate: false,
            } => self.holds(field, values),
            // Each part that has one narrows the rows; the rest are left
            // to the exact condition. Bounds on one key and kind are one
            // range.
            Filter::And(fs) => {
                let mut ranges: Vec<(&str, char, Vec<Bound>)> = Vec::new();
                let mut rest = Vec::new();
                for f in fs {
                    match range(f) {
                        Some((field, kind, bound)) => {
                            match ranges.iter_mut().find(|r| r.0 == field && r.1 == kind) {
                                Some(r) => r.2.push(bound),
                                None => ranges.push((field, kind, vec![bound])),
                            }
                        }
                        None => rest.push(f),
                    }
                }
                let mut parts: Vec<String> = Vec::new();
                for (field, kind, bounds) in &ranges {
                    parts.extend(self.values(field, *kind, bounds));
                }
                parts.extend(rest.into_iter().filter_map(|f| self.attempt(f)));
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

    /// The documents holding a `kind` value under `field` within every
    /// one of `bounds` (more than one: or an array under it).
    fn values(&mut self, field: &str, kind: char, bounds: &[Bound]) -> Option<String> {
        let on = self.document?;
        let key = self.bind(Bind::Text(field.to_owned()));
        let scope = format!(
            "SELECT v.document_id FROM document_values v WHERE v.collection_id = {} \
             AND v.field = {key}::text AND v.kind = '{kind}'",
            on.collection
        );
        let mut within = scope.clone();
        for b in bounds {
            let p = self.bind(Bind::Float(b.value));
            within.push_str(&format!(" AND v.value {} {p}::float8", b.op));
        }
        if bounds.len() > 1 {
            within.push_str(&format!(" UNION ALL {scope} AND v.in_array"));
        }
        // The ids as one array (an init plan, read once): the planner
        // then looks each document up once, where `IN` joined the chunks
        // first and looked their document up for each (at 1M chunks, a
        // 1 % range's count 187 ms against 33).
        Some(format!("{} = ANY (ARRAY({within}))", on.id))
    }

    /// `meta` holds `field` equal to one of `values`, or an array with one.
    fn holds(&mut self, field: &str, values: &[Scalar]) -> Option<String> {
        if field.contains('.') || values.is_empty() {
            return None;
        }
        let mut shapes = Vec::new();
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
                shapes.push(serde_json::Value::Object(object).to_string());
            }
        }
        if shapes.len() > HOLDS_MAX_SHAPES {
            // One array parameter: still a superset, though GIN does not
            // answer `@> ANY` (the planner reads the documents instead).
            let p = self.bind(Bind::Texts(shapes));
            return Some(format!("{} @> ANY ({p}::text[]::jsonb[])", self.meta));
        }
        let parts: Vec<String> = shapes
            .into_iter()
            .map(|shape| {
                let p = self.bind(Bind::Text(shape));
                format!("{} @> {p}::text::jsonb", self.meta)
            })
            .collect();
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

/// The functions behind `document_values`, made again at every start
/// (they lock no table). They must give the values the exact condition
/// compares: a change to what they store needs `document_values` filled
/// again.
pub const VALUES_FUNCTIONS: [&str; 2] = [
    r#"CREATE OR REPLACE FUNCTION ragtime_values(meta jsonb)
RETURNS TABLE (field text, kind "char", value float8, in_array boolean)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
SELECT e.key, x.kind, x.value, el.in_array
FROM jsonb_each(CASE WHEN jsonb_typeof(meta) = 'object' THEN meta ELSE '{}'::jsonb END) e
CROSS JOIN LATERAL (
    SELECT e.value, false WHERE jsonb_typeof(e.value) <> 'array'
    UNION ALL
    SELECT a.v, true FROM jsonb_array_elements(
        CASE WHEN jsonb_typeof(e.value) = 'array' THEN e.value ELSE '[]'::jsonb END) a(v)
) el(v, in_array)
CROSS JOIN LATERAL (
    SELECT 'n'::"char", CASE WHEN jsonb_typeof(el.v) = 'number' AND (el.v = '0'::jsonb
        OR abs((el.v #>> '{}')::numeric) BETWEEN 4.9406564584124654e-324 AND 1.7976931348623157e308)
        THEN (el.v #>> '{}')::float8 END
    UNION ALL
    SELECT 'd'::"char", CASE WHEN jsonb_typeof(el.v) = 'string'
        THEN ragtime_rfc3339_ms(el.v #>> '{}')::float8 END
) x(kind, value)
WHERE x.value IS NOT NULL
$fn$"#,
    r#"CREATE OR REPLACE FUNCTION ragtime_document_values() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        DELETE FROM document_values WHERE document_id = NEW.id;
    END IF;
    INSERT INTO document_values (document_id, collection_id, field, kind, value, in_array)
    SELECT NEW.id, NEW.collection_id, v.field, v.kind, v.value, v.in_array
    FROM ragtime_values(NEW.metadata::jsonb) v;
    RETURN NULL;
END
$fn$"#,
];

/// `document_values` and what keeps it current: a row for every number
/// and every RFC 3339 date a document's metadata holds under a top-level
/// key, or as an element of an array there (`in_array`), with the value
/// the exact condition compares (`(v #>> '{}')::float8`; a date's
/// `ragtime_rfc3339_ms`). Range filters read it through its B-tree
/// ([`index_condition`]). A trigger writes a document's rows in the
/// document's own transaction, from any process; a document's removal
/// takes its rows with it. A number a `float8` cannot hold (which
/// `serde_json` never writes) has no row: the exact condition could not
/// compare it either. Made with the engine's schema, after
/// [`RFC3339_FUNCTION`]; the caller fills it in for documents written
/// before it existed ([`DOCUMENT_VALUES_FILL`]), and makes
/// [`VALUES_FUNCTIONS`] first.
pub const DOCUMENT_VALUES: [&str; 5] = [
    "CREATE TABLE IF NOT EXISTS document_values (\
     document_id BIGINT NOT NULL REFERENCES documents(id) ON DELETE CASCADE, \
     collection_id BIGINT NOT NULL, field TEXT NOT NULL, kind \"char\" NOT NULL, \
     value FLOAT8 NOT NULL, in_array BOOLEAN NOT NULL)",
    "CREATE INDEX IF NOT EXISTS document_values_range ON document_values \
     (collection_id, field, kind, value) INCLUDE (document_id)",
    "CREATE INDEX IF NOT EXISTS document_values_arrays ON document_values \
     (collection_id, field, kind) INCLUDE (document_id) WHERE in_array",
    "CREATE INDEX IF NOT EXISTS document_values_document ON document_values (document_id)",
    "CREATE TRIGGER documents_values AFTER INSERT OR UPDATE OF metadata, collection_id \
     ON documents FOR EACH ROW EXECUTE FUNCTION ragtime_document_values()",
];

/// Fills `document_values` for every document (once, when the table is
/// made: the trigger keeps it from then on).
pub const DOCUMENT_VALUES_FILL: &str = "INSERT INTO document_values \
     (document_id, collection_id, field, kind, value, in_array) \
     SELECT d.id, d.collection_id, v.field, v.kind, v.value, v.in_array \
     FROM documents d CROSS JOIN LATERAL ragtime_values(d.metadata::jsonb) v";

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
        // The whole key and its two parts, then the values of each type as
        // one array for an array's elements and again for a single value.
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
            assert_eq!(
                c.binds[i],
                Bind::Texts(vec!["x'); DROP TABLE t; --".into()])
            );
            assert_eq!(c.binds[i + 1], Bind::Floats(vec![2.0]));
        }
    }

    #[test]
    fn an_in_list_of_any_length_binds_a_few_parameters() {
        let values: Vec<serde_json::Value> = (0..70_000).map(|i| json!(format!("v{i}"))).collect();
        let f = Filter::parse(&json!({"tag": {"$in": values}}), "f").expect("parse");
        let c = compile(&f, "d.meta", 1);
        assert_eq!(c.binds.len(), 3, "the key, then the strings twice");
        let on = Documents {
            meta: "d.meta",
            id: "d.id",
            collection: "$1",
        };
        let index = index_condition(&f, &on, 2).expect("a superset");
        assert_eq!(index.binds.len(), 1, "{}", index.sql);
        assert!(index.sql.contains("@> ANY"), "{}", index.sql);
        // A short list keeps the tests GIN answers.
        let f = Filter::parse(&json!({"tag": {"$in": ["a", "b"]}}), "f").expect("parse");
        assert_eq!(
            index_condition(&f, &on, 2).expect("superset").binds.len(),
            4
        );
    }

    #[test]
    fn a_plain_key_is_looked_up_once_and_everything_matches_true() {
        let c = compile(&Filter::All, "m", 1);
        assert_eq!(c.sql, "TRUE");
        let f = Filter::parse(&json!({"lang": "en"}), "f").expect("parse");
        let c = compile(&f, "m", 1);
        assert!(!c.sql.contains("COALESCE"), "{}", c.sql);
    }

    /// The index condition for filter `v` in documents `d`, metadata `m`,
    /// collection `$9`, from `$1`.
    fn cond(v: serde_json::Value) -> Option<Condition> {
        let on = Documents {
            meta: "m",
            id: "d.id",
            collection: "$9",
        };
        index_condition(&Filter::parse(&v, "f").expect("parse"), &on, 1)
    }

    #[test]
    fn an_index_condition_is_a_containment_only_where_it_holds_every_match() {
        let c = cond(json!({"lang": "en"})).expect("the equality");
        assert_eq!(c.sql, "(m @> $1::text::jsonb OR m @> $2::text::jsonb)");
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
            {"$or": [{"lang": "de"}, {"lang": {"$gt": "e"}}]},
            {"n": {"$in": [1, "2024-05-01"]}},
            {"ok": true}
        ]}))
        .expect("the boolean");
        assert_eq!(c.sql, "((m @> $1::text::jsonb OR m @> $2::text::jsonb))");
        assert_eq!(c.binds.len(), 2, "{:?}", c.binds);
        for none in [
            json!({"lang": {"$gte": "en"}}),
            json!({"lang": {"$ne": "en"}}),
            json!({"lang": {"$nin": ["en"]}}),
            json!({"$not": {"lang": "en"}}),
            json!({"$not": {"year": {"$gt": 3}}}),
            json!({"$or": [{"lang": "en"}, {"year": {"$ne": 3}}]}),
            json!({"at": "2024-05-01"}),
            json!({"source.year": 2019}),
            json!({"source.year": {"$gt": 2019}}),
            json!({"n": 9_007_199_254_740_993_u64}),
        ] {
            assert!(cond(none.clone()).is_none(), "{none}");
        }
    }

    #[test]
    fn a_range_reads_the_values_of_its_key_and_one_keys_bounds_read_one_range() {
        let c = cond(json!({"year": {"$gte": 2020}})).expect("a number's range");
        assert_eq!(
            c.sql,
            "d.id = ANY (ARRAY(SELECT v.document_id FROM document_values v WHERE v.collection_id = $9 \
             AND v.field = $1::text AND v.kind = 'n' AND v.value >= $2::float8))"
        );
        assert_eq!(c.binds, [Bind::Text("year".into()), Bind::Float(2020.0)]);
        let c = cond(json!({"at": {"$lt": "1970-01-02"}})).expect("a date's range");
        assert!(
            c.sql.contains("v.kind = 'd' AND v.value < $2::float8"),
            "{}",
            c.sql
        );
        assert_eq!(c.binds[1], Bind::Float(86_400_000.0));
        // Two bounds on one key: one range, and the documents holding an
        // array there (each bound may pass on another element).
        let c = cond(json!({"$and": [{"year": {"$gt": 2000, "$lte": 2010}}, {"lang": "en"}]}))
            .expect("both");
        assert_eq!(c.sql.matches("document_values").count(), 2, "{}", c.sql);
        assert!(
            c.sql
                .contains("v.value > $2::float8 AND v.value <= $3::float8 UNION ALL"),
            "{}",
            c.sql
        );
        assert!(
            c.sql
                .ends_with("AND v.in_array))) AND (m @> $4::text::jsonb OR m @> $5::text::jsonb))"),
            "{}",
            c.sql
        );
        // A number's bounds and a date's on one key are two ranges.
        let c = cond(json!({"$and": [{"k": {"$gt": 1}}, {"k": {"$lt": "2024-01-01"}}]}))
            .expect("two kinds");
        assert_eq!(c.sql.matches(" = ANY (").count(), 2, "{}", c.sql);
        assert!(!c.sql.contains("in_array"), "{}", c.sql);
        // Every branch of an $or has one.
        let c = cond(json!({"$or": [{"year": {"$lt": 3}}, {"lang": "en"}]})).expect("or");
        assert!(
            c.sql.starts_with("(d.id = ANY (") && c.sql.contains(" OR "),
            "{}",
            c.sql
        );
    }
}
