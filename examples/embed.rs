//! Running shepherd inside an existing actix-web application, with its
//! admin routes mounted under `/shepherd`.
//!
//!     SHEPHERD_CONFIG=shepherd.toml cargo run --example embed
//!
//! `EMBED_LISTEN` sets the address (default 127.0.0.1:8080).

use actix_web::{App, HttpResponse, HttpServer, web};

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    // shepherd's own configuration, as `shepherd run` reads it.
    let path = std::env::var_os("SHEPHERD_CONFIG").map(std::path::PathBuf::from);
    let cfg = shepherd::Config::load(path.as_deref())?;
    shepherd::telemetry::init(&cfg.log);

    // Start shepherd's actors in this application's actix system.
    let running = shepherd::supervisor::start(cfg).await?;
    let admin = web::Data::new(running.admin.clone());

    // The application's own routes, and shepherd's under /shepherd.
    let listen = std::env::var("EMBED_LISTEN").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let server = HttpServer::new(move || {
        App::new()
            .route(
                "/",
                web::get().to(|| async { HttpResponse::Ok().body("my admin application\n") }),
            )
            .service(
                web::scope("/shepherd")
                    .app_data(admin.clone())
                    .configure(shepherd::admin::routes),
            )
    })
    .bind(&listen)?;
    println!(
        "listening on http://{}/ (shepherd under /shepherd/)",
        server.addrs()[0]
    );

    // actix-web stops on SIGINT/SIGTERM; then shepherd drains.
    server.run().await?;
    running.shutdown().await;
    Ok(())
}
