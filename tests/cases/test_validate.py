"""harness.cases.validate: a bad config is one line naming the file, the case and the field."""

from __future__ import annotations

import pytest

from harness.cases import ConfigError, load_config
from tests.cases.config_files import minimal, write


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(modelz=[]), "top level: unknown key 'modelz'; expected one of: "),
    (lambda d: d["test_groups"][0].update(tests=[{"args": {}}]),
     "tag 'basic', tests[0]: missing required key 'id'"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(pipeline_parallel=[2]),
     "tag 'basic', case 'pp2', field args.pipeline_parallel: [2] is not of type integer or string"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(pipeline_parallel="two"),
     "case 'pp2', field args.pipeline_parallel: 'two' is not an integer"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(dtype="fp16"),
     "case 'pp2', field args.dtype: 'fp16' is not one of float32, bfloat16"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(pipeline_paralel=2),
     "case 'pp2', field args.pipeline_paralel: unknown trainer flag 'pipeline_paralel'; did "
     "you mean 'pipeline_parallel'?"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(zero_stage=5),
     "case 'pp2', field args.zero_stage: 5 is not an integer from 0 to 3"),
    (lambda d: d["test_groups"][0].update(reference={"dtype": "bfloat16"}),
     "tag 'basic', field reference: reference.dtype: not a topology flag; a reference keeps the "
     "case's mathematics and may only name its topology"),
    (lambda d: d.update(reference={"tensor_parallel": 3, "nthread_per_process": 4}),
     "case 'pp2', field reference: 4 processes is not a multiple of tensor_parallel * "
     "pipeline_parallel = 3 * 1 = 3"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(output_dir="x"),
     "case 'pp2', field args.output_dir: is set by the harness"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(nthread_per_process=3),
     "case 'pp2', field args.nthread_per_process: 3 processes is not a multiple of"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(total_batch_size=100),
     "case 'pp2', field args.total_batch_size: 100 is not a multiple of batch_size * "
     "sequence_length * data-parallel size = 4 * 64 * 1 = 256"),
    (lambda d: d["test_groups"][0]["tests"][0].update(id="pp 2"),
     "tag 'basic', case 'pp 2', field id: 'pp 2' does not match the pattern"),
    (lambda d: d["test_groups"][0].update(tag="pipeline-layout"),
     "tag 'pipeline-layout', field tag: 'pipeline-layout' does not match the pattern"),
    (lambda d: d.update(models=["gpt3"]), "field models[0]: 'gpt3' is not one of 'gpt2', 'llama3'"),
    (lambda d: d.update(compare={"loss": False, "gradients": False}),
     "field compare: compares nothing"),
    (lambda d: d.update(trainer={"backend": "command"}),
     "field trainer: backend 'command' needs a `command` template"),
])
def test_bad_configs_give_one_line_naming_file_case_field(tmp_path, mutate, message):
    data = minimal()
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    text = str(error.value)
    assert text.startswith(f"{path}: ") and "\n" not in text
    assert message in text, text
