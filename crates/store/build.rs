// `sqlx::migrate!` embeds the migrations at compile time: rebuild when one
// is added or changed, not only when this crate's sources change.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
