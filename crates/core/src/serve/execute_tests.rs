//! The execute path in-process, through the fakes.

use super::fakes::*;
use super::*;

#[test]
fn backend_settings_from_triton_json() {
    let s = BackendSettings::from_json(
        r#"{"cmdline":{"onnxruntime-library":"/x/libonnxruntime.so","default-max-batch-size":"8","auto-complete-config":"true"}}"#,
        &[],
    )
    .unwrap();
    assert_eq!(s.cmdline["onnxruntime-library"], "/x/libonnxruntime.so");
    assert_eq!(s.default_max_batch_size, 8);
    assert_eq!(
        BackendSettings::from_json("", &[]).unwrap().default_max_batch_size,
        crate::config::DEFAULT_MAX_BATCH_SIZE
    );
    assert!(
        BackendSettings::from_json(r#"{"cmdline":{"default-max-batch-size":"x"}}"#, &[]).is_err()
    );
}

#[test]
fn a_mixed_batch_answers_each_request_and_runs_the_good_ones_once() {
    let (m, factory) = model("KIND_CPU");
    let inst = instance(&m, "doubler_0", Device::Cpu);
    let server = FakeServer::default();
    let requests = vec![
        request("good-1", &[1, 2], &[1.0, 2.0], None),
        request("bad-shape", &[1, 3], &[1.0, 2.0, 3.0], None),
        request("good-2", &[2, 2], &[3.0, 4.0, 5.0, 6.0], None),
        request("engine-refuses", &[1, 2], &[13.0, 0.0], None),
    ];
    execute(&inst, &server, requests);

    let sent = server.sent.borrow();
    assert_eq!(sent.len(), 4, "every request is answered");
    let by_id = |id: &str| sent.iter().find(|s| s.0 == id).unwrap();
    let out = |id: &str| floats(&by_id(id).2[0].2);
    assert_eq!(out("good-1"), vec![2.0, 4.0]);
    assert_eq!(out("good-2"), vec![6.0, 8.0, 10.0, 12.0]);
    assert_eq!(by_id("good-2").2[0].1, vec![2, 2], "each response gets its own rows' shape");
    let err = by_id("bad-shape").1.clone().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArg);
    assert!(err.message().contains("input 'X'") && err.message().contains("shape"), "{err}");
    assert!(by_id("bad-shape").2.is_empty(), "a refused request gets no outputs");
    assert!(by_id("engine-refuses").1.as_ref().unwrap_err().message().contains("13"));
    // the two good requests ran together, once, as 3 rows
    assert_eq!(*factory.runs.lock().unwrap(), vec![(3, Device::Cpu)]);
    let reports = server.reports.borrow();
    assert_eq!(reports.len(), 4, "statistics for every request");
    assert_eq!(reports.iter().filter(|r| r.1).count(), 2);
    assert_eq!(*server.batches.borrow(), vec![3]);
}

#[test]
fn each_sequence_gets_its_own_rows_of_the_state_output_back() {
    // Y is the model's output and, through sequence_batching, also the state fed to X
    // of the next request: X is a state input the server adds, and clients ask for nothing
    let config = r#"{"name": "doubler", "max_batch_size": 8,
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}],
        "sequence_batching": {"oldest": {}, "state": [{"input_name": "X", "output_name": "Y", "data_type": "TYPE_FP32", "dims": [2]}]},
        "instance_group": [{"kind": "KIND_CPU", "count": 1}]}"#;
    let (m, factory) = load_config(config).unwrap();
    assert_eq!(
        m.config().inputs.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["X"],
        "the state input is the model's input"
    );
    let inst = instance(&m, "seq", Device::Cpu);
    let server = FakeServer::default();
    let mut requests = vec![
        request("a", &[1, 2], &[1.0, 2.0], None),
        request("refused", &[1, 2], &[13.0, 0.0], None),
        request("b", &[1, 2], &[5.0, 6.0], None),
        request("undeliverable", &[1, 2], &[7.0, 8.0], None),
    ];
    for r in &mut requests {
        r.outputs.clear();
    }
    // this client asks for the state output too, and it cannot be delivered: the state
    // is staged when the run gives it, the response fails after, so nothing may be committed
    requests[3].outputs = vec!["Y".to_string()];
    let states: Vec<_> = requests.iter().map(|r| r.id.clone()).collect();
    let kept = Rc::new(RefCell::new(Vec::new()));
    /// Each request's id with the states it handed back.
    type Kept = Rc<RefCell<Vec<(String, Vec<FakeState>)>>>;
    struct Spy(FakeServer, Kept);
    impl Transport for Spy {
        type Request = FakeRequest;
        type Response = FakeResponse;
        fn respond(&self, r: &FakeRequest) -> Result<FakeResponse> {
            let mut resp = self.0.respond(r)?;
            resp.undeliverable = r.id == "undeliverable";
            Ok(resp)
        }
        fn report(&self, r: &FakeRequest, ok: bool, t: Timing) {
            self.1.borrow_mut().push((r.id.clone(), r.states.borrow().clone()));
            self.0.report(r, ok, t)
        }
        fn report_batch(&self, rows: u64, t: Timing) {
            self.0.report_batch(rows, t)
        }
        fn now_ns(&self) -> u64 {
            self.0.now_ns()
        }
        fn device_ops(&self) -> &dyn DeviceOps {
            self.0.device_ops()
        }
    }
    let spy = Spy(server, kept.clone());
    execute(&inst, &spy, requests);
    let kept = kept.borrow();
    assert_eq!(kept.iter().map(|k| k.0.clone()).collect::<Vec<_>>(), states);
    assert_eq!(kept[0].1, vec![("Y".to_string(), vec![1, 2], to_bytes(&[2.0, 4.0]))]);
    assert!(kept[1].1.is_empty(), "a refused request leaves its sequence's state as it was");
    assert_eq!(kept[2].1, vec![("Y".to_string(), vec![1, 2], to_bytes(&[10.0, 12.0]))]);
    assert!(
        kept[3].1.is_empty(),
        "a request whose output could not be delivered leaves its sequence's state as it was"
    );
    let sent = spy.0.sent.borrow();
    assert!(sent.iter().all(|s| s.2.is_empty()), "no client got Y");
    let failed = sent.iter().find(|s| s.0 == "undeliverable").unwrap().1.clone().unwrap_err();
    assert!(failed.message().contains("too small"), "{failed}");
    assert!(sent.iter().find(|s| s.0 == "b").unwrap().1.is_ok());
    assert_eq!(
        *factory.runs.lock().unwrap(),
        vec![(3, Device::Cpu)],
        "the three sequences ran as one batch"
    );
}

#[test]
fn gpu_resident_inputs_are_gathered_on_their_device_and_answered_there() {
    let (m, factory) = model("KIND_GPU");
    let inst = instance(&m, "doubler_gpu", Device::Gpu(0));
    let server = FakeServer::default();
    let requests = vec![
        request("gpu-1", &[1, 2], &[1.0, 2.0], Some(0)),
        request("host", &[1, 2], &[7.0, 8.0], None),
        request("gpu-2", &[2, 2], &[3.0, 4.0, 5.0, 6.0], Some(0)),
    ];
    execute(&inst, &server, requests);

    // the two GPU requests form one batch gathered on GPU 0; the host one runs apart
    assert_eq!(server.device.gathers.load(Ordering::Relaxed), 1);
    let mut runs = factory.runs.lock().unwrap().clone();
    runs.sort_by_key(|r| r.0);
    assert_eq!(runs, vec![(1, Device::Cpu), (3, Device::Gpu(0))]);
    let sent = server.sent.borrow();
    let by_id = |id: &str| sent.iter().find(|s| s.0 == id).unwrap();
    // every output is offered as the GPU instance's memory, and an ensemble's Triton gives that
    for (id, want) in [
        ("gpu-1", vec![2.0, 4.0]),
        ("gpu-2", vec![6.0, 8.0, 10.0, 12.0]),
        ("host", vec![14.0, 16.0]),
    ] {
        let s = by_id(id);
        assert!(s.1.is_ok(), "{id}: {:?}", s.1);
        assert_eq!(floats(&s.2[0].2), want, "{id}");
        assert_eq!(s.2[0].3, Device::Gpu(0), "{id}: answered in GPU memory");
    }
    assert_eq!(
        *factory.landed.lock().unwrap(),
        vec![false, false],
        "each run told its outputs went to the GPU"
    );
}

#[test]
fn inputs_on_another_gpu_reach_the_engine_on_its_own() {
    let (m, factory) = model("KIND_GPU");
    let inst = instance(&m, "doubler_gpu1", Device::Gpu(1));
    // a client's CUDA shared memory on GPU 0 or 1; Triton hands the buffers over as they are
    let server = FakeServer::default();
    execute(
        &inst,
        &server,
        vec![
            request("on0", &[1, 2], &[1.0, 2.0], Some(0)),
            request("on1", &[2, 2], &[3.0, 4.0, 5.0, 6.0], Some(1)),
            request("also0", &[1, 2], &[7.0, 8.0], Some(0)),
        ],
    );
    // one batch, gathered onto GPU 1 from both GPUs
    assert_eq!(*factory.runs.lock().unwrap(), vec![(4, Device::Gpu(1))]);
    assert_eq!(server.device.gathers.load(Ordering::Relaxed), 1);
    let sent = server.sent.borrow();
    for (id, want) in
        [("on0", vec![2.0, 4.0]), ("on1", vec![6.0, 8.0, 10.0, 12.0]), ("also0", vec![14.0, 16.0])]
    {
        let s = sent.iter().find(|s| s.0 == id).unwrap();
        assert!(s.1.is_ok(), "{id}: {:?}", s.1);
        assert_eq!(floats(&s.2[0].2), want, "{id}");
    }
    drop(sent);
    // a lone request on GPU 0 is moved too: the engine never sees another GPU's memory
    execute(&inst, &server, vec![request("alone0", &[1, 2], &[9.0, 1.0], Some(0))]);
    assert_eq!(factory.runs.lock().unwrap()[1], (1, Device::Gpu(1)));
    assert_eq!(server.device.gathers.load(Ordering::Relaxed), 2);
    let sent = server.sent.borrow();
    assert_eq!(floats(&sent.iter().find(|s| s.0 == "alone0").unwrap().2[0].2), vec![18.0, 2.0]);
    // and one already on the instance's GPU is used in place
    drop(sent);
    execute(&inst, &server, vec![request("alone1", &[1, 2], &[1.0, 1.0], Some(1))]);
    assert_eq!(server.device.gathers.load(Ordering::Relaxed), 2);
}

#[test]
fn a_gpu_model_counts_what_its_instances_ran_on_each_device() {
    let (m, _) = model("KIND_GPU");
    let on = |id| {
        InstanceState::new(
            &m,
            InstanceContext { name: format!("doubler_{id}"), device: Device::Gpu(id) },
        )
        .unwrap()
    };
    let (gpu0, gpu1, also1) = (on(0), on(1), on(1));
    let server = FakeServer::default();
    execute(&gpu0, &server, vec![request("a", &[2, 2], &[1.0, 2.0, 3.0, 4.0], Some(0))]);
    execute(&gpu1, &server, vec![request("b", &[1, 2], &[1.0, 2.0], Some(0))]);
    execute(&also1, &server, vec![request("c", &[3, 2], &[1.0; 6], Some(1))]);
    // a refused request runs nothing
    execute(&also1, &server, vec![request("bad", &[1, 2], &[13.0, 0.0], Some(1))]);
    let samples = m.metrics_source().expect("a KIND_GPU model publishes").samples();
    let value = |family: &str, device: &str| {
        samples
            .iter()
            .find(|s| s.family == family && s.labels == vec![("device", device.to_string())])
            .map(|s| s.value)
    };
    assert_eq!(value("rust_device_inferences_total", "GPU 0"), Some(2.0));
    assert_eq!(value("rust_device_inferences_total", "GPU 1"), Some(4.0));
    assert_eq!(value("rust_device_executions_total", "GPU 1"), Some(2.0));
    let (cpu, _) = model("KIND_CPU");
    assert!(cpu.metrics_source().is_none(), "a CPU model publishes only what its engine has");
}

#[test]
fn a_gpu_engine_learns_whether_responses_want_its_outputs_on_the_host() {
    let (m, factory) = model("KIND_GPU");
    let inst = instance(&m, "doubler_gpu", Device::Gpu(0));
    // a client's responses (gRPC, HTTP, system shared memory): host memory
    let client = FakeServer { host_only: true, ..FakeServer::default() };
    execute(&inst, &client, vec![request("c", &[1, 2], &[1.0, 2.0], Some(0))]);
    assert_eq!(client.sent.borrow()[0].2[0].3, Device::Cpu);
    assert_eq!(floats(&client.sent.borrow()[0].2[0].2), vec![2.0, 4.0]);
    // an ensemble step's: the GPU memory offered for it
    let ensemble = FakeServer::default();
    execute(&inst, &ensemble, vec![request("e", &[1, 2], &[3.0, 4.0], Some(0))]);
    assert_eq!(ensemble.sent.borrow()[0].2[0].3, Device::Gpu(0));
    // a refused request writes no output: nothing to learn from
    execute(&inst, &client, vec![request("bad", &[1, 2], &[13.0, 0.0], Some(0))]);
    assert_eq!(*factory.landed.lock().unwrap(), vec![true, false]);
}

#[test]
fn settings_are_parsed_once_per_model_however_many_instances_it_has() {
    let core_before = crate::settings::PARSED.with(|n| n.get());
    let (m, counts) = model("KIND_CPU");
    let instances: Vec<InstanceState> = [Device::Cpu, Device::Cpu, Device::Gpu(0), Device::Gpu(1)]
        .into_iter()
        .enumerate()
        .map(|(i, device)| {
            InstanceState::new(&m, InstanceContext { name: format!("doubler_{i}"), device })
                .unwrap()
        })
        .collect();
    assert_eq!(counts.loads.load(Ordering::Relaxed), 1, "one load per model");
    assert_eq!(counts.settings_parsed.load(Ordering::Relaxed), 1, "the engine's settings once");
    assert_eq!(crate::settings::PARSED.with(|n| n.get()) - core_before, 1, "the core's once");
    assert_eq!(counts.instances.load(Ordering::Relaxed), 4, "one engine per instance");
    // each instance runs with what its model parsed
    let server = FakeServer::default();
    execute(&instances[3], &server, vec![request("r", &[1, 2], &[1.0, 2.0], None)]);
    assert_eq!(floats(&server.sent.borrow()[0].2[0].2), vec![2.0, 4.0]);
}

#[test]
fn a_model_is_described_then_loaded_once_on_its_completed_config() {
    // no tensors listed: the kind describes the model, the config is completed from that,
    // and the one load sees the completed config (its input), its settings parsed once
    let bare = r#"{"name": "doubler", "parameters": {"scale": {"string_value": "3"}}}"#;
    let (m, counts, completed) = load_config_completing(bare, true).unwrap();
    assert!(completed.is_some_and(|c| c.contains("\"X\"")), "the config completed");
    assert_eq!(counts.described.load(Ordering::Relaxed), 1, "described once");
    assert_eq!(counts.loads.load(Ordering::Relaxed), 1, "loaded once");
    assert_eq!(*counts.load_inputs.lock().unwrap(), vec![1], "the load saw the final config");
    assert_eq!(
        counts.settings_parsed.load(Ordering::Relaxed),
        1,
        "the description's settings kept"
    );
    let inst = instance(&m, "doubler_0", Device::Cpu);
    let server = FakeServer::default();
    execute(&inst, &server, vec![request("r", &[1, 2], &[1.0, 2.0], None)]);
    assert_eq!(floats(&server.sent.borrow()[0].2[0].2), vec![3.0, 6.0]);
    // a config that lists its tensors is final as written: no description
    let (_, counts) = model("KIND_CPU");
    assert_eq!(counts.described.load(Ordering::Relaxed), 0);
}

#[test]
fn a_bad_engine_setting_fails_the_load_naming_it() {
    let e = load_config(
        r#"{"name": "doubler", "max_batch_size": 8, "parameters": {"scale": {"string_value": "x"}},
            "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
            "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}]}"#,
    )
    .err()
    .unwrap();
    assert!(e.message().contains("'scale'"), "{e}");
}

#[test]
fn a_batch_that_fails_on_one_clients_input_answers_the_others() {
    let (m, factory) = model("KIND_CPU");
    let inst = instance(&m, "doubler_0", Device::Cpu);
    let server = FakeServer::default();
    execute(
        &inst,
        &server,
        vec![
            request("a", &[1, 2], &[1.0, 2.0], None),
            request("bad", &[1, 2], &[99.0, 0.0], None),
            request("c", &[2, 2], &[3.0, 4.0, 5.0, 6.0], None),
        ],
    );
    let sent = server.sent.borrow();
    let by = |id: &str| sent.iter().find(|s| s.0 == id).unwrap();
    let bad = by("bad").1.clone().unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidArg);
    assert!(bad.message().contains("input 'X'") && bad.message().contains("99"), "{bad}");
    assert_eq!(floats(&by("a").2[0].2), vec![2.0, 4.0]);
    assert_eq!(floats(&by("c").2[0].2), vec![6.0, 8.0, 10.0, 12.0]);
    // the batch of four rows, then each request alone
    assert_eq!(
        *factory.runs.lock().unwrap(),
        vec![(4, Device::Cpu), (1, Device::Cpu), (1, Device::Cpu), (2, Device::Cpu)]
    );
}

/// An instance of `m` named `name` on `device`.
fn instance(m: &ModelState, name: &str, device: Device) -> InstanceState {
    InstanceState::new(m, InstanceContext { name: name.into(), device }).unwrap()
}
