use clap::Parser;

fn main() -> anyhow::Result<()> {
    let code = prescale::cli::run(prescale::cli::Cli::parse())?;
    std::process::exit(code);
}
