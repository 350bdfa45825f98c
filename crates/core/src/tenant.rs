//! Tenants and their namespaces. Every tenant has its own collections and
//! conversations: the default tenant's names are stored as they are,
//! others' behind a prefix that no user-chosen name can contain.

/// The tenant requests act for without an API key.
pub const DEFAULT_TENANT: &str = "default";

/// The tenant a request acts for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenant(pub String);

impl Tenant {
    pub fn default_tenant() -> Self {
        Self(DEFAULT_TENANT.to_owned())
    }

    pub fn name(&self) -> &str {
        &self.0
    }

    /// The stored name of the tenant's collection `name` (checked with
    /// [`valid_collection`], so it holds no `~`).
    pub fn collection(&self, name: &str) -> String {
        if self.0 == DEFAULT_TENANT {
            name.to_owned()
        } else {
            format!("{}~{name}", self.0)
        }
    }

    /// What every stored name of the tenant's collections starts with
    /// ("" for the default tenant, whose names hold no `~`).
    pub fn collection_prefix(&self) -> String {
        if self.0 == DEFAULT_TENANT {
            String::new()
        } else {
            format!("{}~", self.0)
        }
    }

    /// The tenant a stored collection name belongs to, and the name as the
    /// tenant knows it.
    pub fn of_collection(stored: &str) -> (Tenant, &str) {
        match stored.split_once('~') {
            Some((tenant, name)) => (Tenant(tenant.to_owned()), name),
            None => (Tenant::default_tenant(), stored),
        }
    }

    /// The stored id of the tenant's conversation `id` (checked with
    /// [`valid_conversation_id`], so it holds no `/`).
    pub fn conversation(&self, id: &str) -> String {
        if self.0 == DEFAULT_TENANT {
            id.to_owned()
        } else {
            format!("{}/{id}", self.0)
        }
    }
}

/// Tenant names: 1–32 of lowercase letters, digits, `_` and `-`.
pub fn valid_tenant(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-'))
}

/// Collection names: 1–64 of `[A-Za-z0-9_.-]`.
pub fn valid_collection(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Conversation ids: 1–128 of letters, digits, `-`, `_`, `.` and `:`.
pub fn valid_conversation_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_cannot_be_reached_by_another_tenant() {
        let acme = Tenant("acme".into());
        let default = Tenant::default_tenant();
        assert_eq!(acme.collection("docs"), "acme~docs");
        assert_eq!(default.collection("docs"), "docs");
        // User-chosen collection names never hold '~', conversation ids never '/'.
        assert!(!valid_collection("acme~docs"));
        assert!(!valid_conversation_id("acme/c1"));
        assert_eq!(acme.conversation("c1"), "acme/c1");
        // A stored name leads back to its tenant; the prefix picks them out.
        for (t, name) in [(&acme, "docs"), (&default, "docs")] {
            let stored = t.collection(name);
            assert!(stored.starts_with(&t.collection_prefix()));
            assert_eq!(Tenant::of_collection(&stored), (t.clone(), name));
        }
        assert_eq!(default.collection_prefix(), "");
        assert!(
            valid_tenant("acme-2")
                && !valid_tenant("Acme")
                && !valid_tenant("a/b")
                && !valid_tenant("")
        );
    }
}
