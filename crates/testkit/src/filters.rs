//! The metadata filter suite both retrieval engines are tested against:
//! documents' metadata of every shape and filters over them, each engine's
//! answer compared with what [`ragtime_core::Filter::matches`] selects.

use serde_json::{Value, json};

/// Where [`filters`]' ranges over one key begin.
pub const RANGES_FROM: usize = 42;

/// Metadata of every shape the filter language meets: numbers, strings,
/// booleans, dates (with offsets, fractions, date-only), arrays, nested
/// objects, a key with a dot in it, nulls, and values of the wrong type.
pub fn metadata() -> Vec<Value> {
    vec![
        json!({"year": 2020, "lang": "en", "ok": true, "tags": ["bio", "cell"], "at": "2024-05-01T12:00:00Z"}),
        json!({"year": 2021.5, "lang": "de", "ok": false, "tags": [], "at": "2024-05-01T13:30:00+02:00"}),
        json!({"year": "2020", "lang": "EN", "tags": "bio", "at": "2024-05-01"}),
        json!({"year": null, "lang": "é", "tags": [1, "x", true], "at": "2024-05-01T11:59:59.999Z"}),
        json!({"source": {"year": 2019, "name": "arxiv"}, "lang": "en"}),
        json!({"source.year": 2022, "source": {"year": 1999}}),
        json!({"source": ["not", "an", "object"], "at": "not a date"}),
        json!({"at": "2024-02-30", "year": 1e3, "ok": "true"}),
        json!({"at": "2024-05-01T12:00:00.5-00:30", "tags": [["nested"]], "lang": "fr"}),
        json!({}),
        json!({"year": [1990, 2010], "at": ["2023-01-01", "2025-01-01T00:00:00Z"], "tags": [3, "2024-05-01"]}),
        json!({"year": -0.0, "at": 20240501, "tags": ["2024-05-01T12:00:00Z"]}),
    ]
}

pub fn filters() -> Vec<Value> {
    vec![
        json!({"year": 2020}),
        json!({"year": {"$gte": 2020}}),
        json!({"year": {"$lt": 2021, "$gt": 1000}}),
        json!({"year": {"$ne": 2020}}),
        json!({"year": "2020"}),
        json!({"year": {"$in": [2020, "2020", 1000]}}),
        json!({"year": {"$nin": [2020]}}),
        json!({"lang": "en"}),
        json!({"lang": {"$gt": "E"}}),
        json!({"lang": {"$lt": "f"}}),
        json!({"lang": {"$gte": "é"}}),
        json!({"ok": true}),
        json!({"ok": {"$ne": true}}),
        json!({"tags": "bio"}),
        json!({"tags": {"$ne": "bio"}}),
        json!({"tags": {"$in": ["x", "cell"]}}),
        json!({"tags": {"$nin": ["bio"]}}),
        json!({"tags": true}),
        json!({"tags": {"$gt": 0}}),
        json!({"at": {"$gte": "2024-05-01T12:00:00Z"}}),
        json!({"at": {"$lt": "2024-05-01T12:00:00Z"}}),
        json!({"at": "2024-05-01T00:00:00Z"}),
        json!({"at": {"$gt": "2024-03-01"}}),
        json!({"at": {"$ne": "2024-05-01"}}),
        json!({"source.year": 2019}),
        json!({"source.year": 2022}),
        json!({"source.year": {"$lt": 2000}}),
        json!({"source.name": {"$in": ["arxiv"]}}),
        json!({"$or": [{"lang": "de"}, {"source.year": {"$gte": 2019}}]}),
        json!({"$and": [{"lang": "en"}, {"year": {"$ne": 2020}}]}),
        json!({"$not": {"lang": "en"}}),
        json!({"missing": {"$ne": 1}}),
        json!({"missing": 1}),
        json!({"lang": "en", "ok": true}),
        json!({"year": 2021.5}),
        json!({"year": 1000}),
        json!({"tags": {"$in": ["bio", 1]}}),
        json!({"$and": [{"$or": [{"lang": "de"}, {"year": {"$gt": 1}}]}, {"ok": true}]}),
        json!({"$or": [{"lang": "en"}, {"tags": "x"}]}),
        // Lists longer than a statement's parameters (65535).
        json!({"year": {"$in": (0..40_000).map(Value::from).chain(["2020".into()]).collect::<Vec<Value>>()}}),
        json!({"tags": {"$nin": (0..40_000).map(|i| Value::from(format!("t{i}"))).chain([Value::from("bio"), Value::from(true)]).collect::<Vec<Value>>()}}),
        // As many conditions as a filter may have, each binding its own
        // parameters, on a dotted field.
        json!({"$or": (0..(ragtime_core::filter::MAX_CONDITIONS / 2) as i64)
            .map(|i| json!({"source.year": i + 1990}))
            .collect::<Vec<Value>>()}),
        // From here (`RANGES_FROM`), ranges the database engine's values'
        // index answers: bounds on one key that an array passes on two
        // elements, dates in arrays, a range and an equality, ranges in
        // every branch of an $or.
        json!({"year": {"$gte": 2000, "$lte": 2001}}),
        json!({"year": {"$lte": 1e3}}),
        json!({"year": {"$gte": 0}}),
        json!({"at": {"$gt": "2024-01-01", "$lt": "2024-06-01"}}),
        json!({"at": {"$gte": "2024-12-31T23:00:00-02:00"}}),
        json!({"tags": {"$gt": 2, "$lt": "2025-01-01"}}),
        json!({"tags": {"$lte": "2024-05-01T12:00:00Z"}}),
        json!({"$and": [{"year": {"$lt": 2021}}, {"lang": "en"}]}),
        json!({"$or": [{"year": {"$lt": 1995}}, {"lang": "fr"}]}),
    ]
}
