"""How a model runs: on which device (`device`), cast, placed and timed by the executor
(`executor`), its batches moved to the device and back (`transfer`), its float32 Linear weights
packed for oneDNN (`packing`), and the BERT encoder batchscore runs natively (`bert`) with its
OpenVINO build (`bert_openvino`). The precisions it runs at are the table's
(`batchscore.precision.table`); which runtime takes which load is the job's runtime table
(`batchscore.job.runtimes`)."""
