"""(jobs/messages) Image-text data and vision-language models, preference data and chat templates, the rarer export
refusals, dataset zips, Ray cluster jobs, the queue's reasons."""

MESSAGES: dict[str, str] = {
    # image-text data (jobs/data/vision_dataset.py, vision_preview.py, jobs/checks/vision.py)
    "vision_text_builtin": "{reference} is text data: a vision-language model trains on {shapes} or a data file "
                           "with image rows",
    "vision_not_data_file": "{reference} is not a data file: image-text data is a local file next to its images",
    "no_image_rows": "{name} has no rows: add at least one image-text example",
    "vision_targets_missing": "{names} match no linear layer of this model; its linear layers are: {leaves} (and "
                              "the aliases vit, aligner)",
    "vision_targets_all_vision": "these names are all in the vision tower or projector: set vision_lora: true to "
                                 "train them",
    # a vision-language model (jobs/models/vision.py)
    "vision_model_unsupported": "{model_type!r} is a vision-language model that Fusetune does not train yet (its "
                                "image tokens are not wired in); supported: {supported}",
    "image_processor_unloadable": "could not load the image processor of {source!r}: {detail}",
    "tokenizer_no_image_token": "the tokenizer has no {token} token: it is not a Qwen2-VL tokenizer",
    "method_text_only": "method {method} does not train vision-language models yet; use method sft",
    # preference data (jobs/data/pair_preview.py, dataset.py's builtin:concise), chat templates, Parquet
    "no_pair_rows": "{name} has no rows: add at least one preference pair",
    "concise_not_generated": "{concise} is made from this base model's own answers, which are generated when the "
                             "first job on it starts (once per model, a few minutes on a CPU); start the job, or "
                             "preview again after it has begun",
    "template_not_prefix_stable_pair": "this model's chat template renders the prompt differently once an answer "
                                       "follows, so the answer part cannot be located; use a prefix-stable template",
    "template_rewrites_turns": "this model's chat template rewrites earlier turns, so the answer part cannot be "
                               "located; use a model with a prefix-stable template",
    "not_parquet": "{name} is not a Parquet file ({detail}); export it again as Parquet, or give the file the "
                   "suffix of its real type",
    # the rarer export refusals (jobs/export/: __init__.py, source.py, families.py, vocab.py, lora_gguf.py)
    "export_format_unknown": "--format {value!r} is not one of {choices}",
    "export_quant_unknown": "--quant {value!r} is not one of {choices}",
    "export_config_refused": "{config_file}: {problem}",
    "export_tensor_not_in_base": "the adapter changes {tensor}, which the base model {base} does not have; was it "
                                 "trained on a different model?",
    "export_base_missing": "cannot find the base model: {problem}",
    "export_adapter_option": "the adapter uses {option}, which export does not support",
    "export_adapter_odd_tensor": "the adapter has a tensor export cannot merge: {tensor}",
    "export_lora_half": "the adapter's LoRA for {tensor} is incomplete (only {halves})",
    "export_tensor_unplaced": "do not know where {tensor} goes in a GGUF file; is this a plain {supported} "
                              "checkpoint?",
    "export_rope_scaling": "GGUF export does not know RoPE scaling {kind!r} of this model",
    "export_no_fast_tokenizer": "GGUF export needs the fast tokenizer file {name}, which {folder} lacks",
    "export_vocab_too_big": "the tokenizer has {count} tokens but the model only {size} embeddings",
    "export_lora_scales_differ": "the adapter's LoRA pairs have different scales; llama.cpp takes one alpha per "
                                 "file",
    # an uploaded .zip of a dataset and its images (jobs/io/dataset_zip.py)
    "zip_symlink": "{member} is a symbolic link: links are not unpacked",
    "zip_outside": "{member} points outside the archive's folder",
    "zip_too_big": "the archive unpacks to more than {megabytes:,.0f} MB",
    "zip_too_many_files": "the archive holds more than {limit:,} files",
    "zip_data_files": "the archive must hold exactly one data file ({suffixes}) beside its images; found {count}: "
                      "{found}",
    "zip_none_found": "none",
    "zip_member_grows": "{member} unpacks to more than its declared size",
    "zip_unreadable": "{name} is not a readable .zip file ({detail})",
    # a job on a Ray cluster (jobs/spec_values.py, jobs/train/cluster.py, ray_driver.py)
    "workers_need_cluster": "is {workers}, but workers run on a Ray cluster: set cluster to its dashboard address "
                            "(http://head-node:8265), or use processes for several processes on this machine",
    "cluster_address_invalid": "{value!r} is not a Ray dashboard address: give one like http://head-node:8265 "
                               "(the address `ray job submit` takes), or leave it empty to train on this machine",
    "cluster_places_job": "chooses this machine's GPUs, but on a Ray cluster Ray places the job: leave it at "
                          "{default} and set workers and gpus_per_worker",
    "ray_not_installed": "cluster is set, but Ray is not installed: pip install -r requirements-cluster.txt "
                         "(here and on the cluster's nodes)",
    "cluster_unreachable": "cannot reach the Ray cluster at {address} ({detail}): check that its head node runs "
                           "(ray start --head --dashboard-host 0.0.0.0) and that this is its dashboard's address",
    # a dashboard with token authentication (jobs/io/cluster_auth.py): 401 without a token, 403 for a wrong one
    "cluster_needs_token": "the Ray cluster at {address} needs a token ({detail}): set FUSETUNE_CLUSTER_TOKEN to "
                           "the cluster's token (`ray get-auth-token` on its head node prints it) where the studio "
                           "runs, or RAY_AUTH_MODE=token there to send Ray's own (RAY_AUTH_TOKEN or ~/.ray/auth_token)",
    "cluster_token_refused": "the Ray cluster at {address} refused the token from {source} ({detail}): set "
                             "FUSETUNE_CLUSTER_TOKEN to the cluster's token (`ray get-auth-token` on its head node "
                             "prints it) where the studio runs",
    "cluster_token_elsewhere": "the Ray cluster at {address} needs a token ({detail}), and this studio sends its "
                               "token only to its own cluster, {cluster}: start the studio with this address as "
                               "--cluster (or FUSETUNE_CLUSTER) to use it",
    "cluster_too_small": "the Ray cluster has {have} {resource} in all, and the job asks for {need} "
                         "(workers x {per_worker} each): lower workers or add nodes",
    "worker_died": "worker {rank} (pid {pid}) on node {node} died at step {step}: {detail}; the last checkpoint "
                   "is kept and resume continues from it",
    "ray_job_failed": "the Ray job {job_id} failed: {detail}",
    # the queue's wait for a cluster's free resources (jobs/queue/cluster_queue.py)
    "wait_cluster": "waiting for the Ray cluster: {problem}",
    "wait_cluster_resources": "waiting for the Ray cluster at {address}: the job needs {need:d} {resource} free, "
                              "{free:d} of its {total:d} are",
    # several machines without Ray: torchrun's rendezvous (jobs/spec_values.py, jobs/launch.py)
    "nodes_need_endpoint": "is empty, but nodes is {count}: every node's torchrun meets at node 0: set it to "
                           "node 0's host:port (e.g. 10.0.0.1:29500)",
    "rdzv_endpoint_invalid": "{value!r} is not host:port: give node 0's address and a free port, e.g. "
                             "10.0.0.1:29500 or [fd00::1]:29500",
    "node_rank_too_big": "is {rank}, but nodes is {count}: number the nodes 0 to {last:d}, node 0 where "
                         "rdzv_endpoint points",
    "nodes_one_machine": "is set, but nodes is 1: a rendezvous is for several machines; set nodes, or leave it empty",
    "nodes_not_on_cluster": "is {count}, but cluster is set: on a Ray cluster Ray places the workers; leave nodes "
                            "at 1 and set workers",
    # the queue's reasons (jobs/queue/runner.py)
    "wait_running_job": "waiting for the running job to finish",
    "owner_stopped_before_start": "the studio instance {owner} that took this job stopped before starting its "
                                  "trainer; start the job again",
    # a config error as the job's error event writes it: the field's name, then why (SpecError)
    "field_error": "{field}: {message}",
}
