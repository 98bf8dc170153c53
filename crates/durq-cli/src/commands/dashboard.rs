//! `durq dashboard`: the web dashboard of `durq-dashboard`, served until ctrl-c.

use tokio::net::TcpListener;

use crate::cli::DashboardArgs;
use crate::{Context, Result};

/// Binds `--listen`, says where the dashboard is once it is bound, and serves it until
/// ctrl-c. A non-loopback address without a token is refused by the dashboard, before
/// it answers anything.
pub async fn serve(cx: &mut Context<'_>, args: &DashboardArgs) -> Result<()> {
    let dashboard = durq_dashboard::Dashboard::new(cx.store.clone())
        .read_only(args.read_only)
        .token(args.token.clone())
        .secure_cookie(args.secure_cookie);
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|err| crate::CliError::new(format!("cannot listen on {}: {err}", args.listen)))?;
    let local = listener.local_addr()?;
    if dashboard.has_token() || local.ip().to_canonical().is_loopback() {
        let mode = if args.read_only { ", read-only" } else { "" };
        cx.terminal.note(&format!(
            "serving the dashboard at http://{local}/{mode} (ctrl-c stops it)"
        ));
    }
    let stop = async {
        // Without a signal handler the server runs until the process is killed.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    durq_dashboard::serve_on(dashboard, listener, stop).await?;
    Ok(())
}
