//! `GET /admin`: the admin page (plain HTML and a little JavaScript, no
//! external assets). It signs in with the admin key and uses the API.

/// The admin page.
#[utoipa::path(get, path = "/admin", tag = "admin",
    responses((status = 200, description = "The page", content_type = "text/html", body = String)))]
pub async fn page() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("page.html"))
}
