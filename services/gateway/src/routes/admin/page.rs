//! `GET /admin`: the admin page (plain HTML and a little JavaScript, no
//! external assets). It signs in with the admin key and uses the API.

/// The admin page.
#[utoipa::path(get, path = "/admin", tag = "admin",
    responses((status = 200, description = "The page", content_type = "text/html", body = String)))]
pub async fn page(
    axum::extract::State(state): axum::extract::State<std::sync::Arc<crate::state::AppState>>,
) -> axum::response::Html<&'static str> {
    // No key to sign in with: say how to turn the admin API on instead of
    // showing a sign-in no key can pass.
    if state.config.admin_key.is_none() {
        return axum::response::Html(OFF);
    }
    axum::response::Html(include_str!("page.html"))
}

const OFF: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<title>ragtime admin</title><style>body{font:15px/1.5 system-ui,sans-serif;max-width:560px;\
margin:64px auto;padding:0 16px}code{background:#f3f3f3;padding:1px 4px}</style></head><body>\
<h1>ragtime admin</h1><p id=\"admin-off\">The admin API is off on this server. To turn it on, \
set an admin key — <code>RAGTIME__ADMIN_KEY</code> in the environment or <code>admin_key</code> \
in <code>ragtime.toml</code> — and restart; then sign in here with it.</p>\
<p><a href=\"/docs\">API reference</a></p></body></html>";
