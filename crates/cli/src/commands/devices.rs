//! `pyramid devices`: the devices a route can name, and what each says about itself.

use anyhow::Result;
use clap::Args;
use pyramid_kernels::isa;
use serde::Serialize;

#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// One JSON object instead of a list.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Device {
    name: String,
    properties: Vec<(String, String)>,
}

#[derive(Serialize)]
struct Listing {
    devices: Vec<Device>,
    /// The OpenVINO build found, or why there is none.
    openvino: Result<String, String>,
}

pub fn run(args: DevicesArgs) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut devices = vec![Device {
        name: "cpu".to_string(),
        properties: vec![
            ("ENGINE".into(), "pyramid native kernels".into()),
            ("ISA".into(), isa::active().name().into()),
            ("CORES".into(), cores.to_string()),
        ],
    }];
    let openvino = match pyramid_openvino::devices() {
        Ok((version, found)) => {
            devices.extend(found.into_iter().map(|d| Device {
                name: d.name,
                properties: d.properties,
            }));
            Ok(version)
        }
        Err(e) => Err(e.to_string()),
    };
    let listing = Listing { devices, openvino };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&listing)?);
        return Ok(());
    }
    for d in &listing.devices {
        println!("{}", d.name);
        for (k, v) in &d.properties {
            println!("    {k}: {v}");
        }
    }
    match &listing.openvino {
        Ok(version) => println!("OpenVINO {version}"),
        Err(why) => println!("no OpenVINO devices: {why}"),
    }
    Ok(())
}
