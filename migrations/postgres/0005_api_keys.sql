-- API keys for end users, one tenant each. Only a SHA-256 of the secret is
-- kept; the key is shown once, when it is created.
CREATE TABLE api_keys (
    id          TEXT   PRIMARY KEY,
    tenant      TEXT   NOT NULL,
    name        TEXT   NOT NULL DEFAULT '',
    secret_hash TEXT   NOT NULL,
    created_ms  BIGINT NOT NULL,
    revoked_ms  BIGINT
);

CREATE INDEX api_keys_by_tenant ON api_keys (tenant);
