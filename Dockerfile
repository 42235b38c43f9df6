# batchscore in a container, on the CPU by default (docs/production.md, "In a container"):
#
#   docker build -t batchscore .
#   docker run --rm batchscore                        # the sample job: summarize the corpus
#   docker run --rm -v "$PWD/jobs:/work/jobs:ro" -v "$PWD/data:/work/data:ro" \
#       -v "$PWD/out:/work/out" batchscore run jobs/embed.toml
#
# CUDA: the same file with torch's CUDA build, from PyPI (whose Linux torch wheels bring the
# CUDA libraries they need; the host needs only NVIDIA's driver and container toolkit):
#
#   docker build --build-arg TORCH_INDEX=https://pypi.org/simple -t batchscore:cuda .
#   docker run --rm --gpus all batchscore:cuda
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS wheel
# The package as a wheel, built here so that the image keeps neither the source nor the build
# tools. Only what the build reads is copied (.dockerignore keeps the rest out of the context).
WORKDIR /src
COPY pyproject.toml README.md ./
COPY batchscore ./batchscore
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:${PYTHON_VERSION}-slim
# torch first, from PyTorch's CPU index: a bare `pip install torch` takes PyPI's CUDA build, some
# GB of GPU libraries a CPU never loads. The version is the Makefile's CPU pin.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
# The extras the shipped jobs use (the Makefile's JOB_EXTRAS): images (Pillow), structured
# (llguidance); add ray, delta, fsspec or report as the jobs you run need them.
ARG EXTRAS=images,structured
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"
COPY --from=wheel /wheels /wheels
# pip keeps the torch above: it satisfies batchscore's range, so no other build is fetched
RUN pip install --no-cache-dir "$(ls /wheels/batchscore-*.whl)[${EXTRAS}]" \
    && rm -rf /wheels

# Never root (by number, so that a cluster's runAsNonRoot can check it): the jobs, data and
# output folders are mounted under /work
RUN useradd --create-home --uid 10001 --user-group batchscore
USER 10001:10001
WORKDIR /work
# The sample corpus (Python's own docstrings, from this image's standard library) and the job
# that summarizes it, so that `docker run batchscore` shows a run with nothing mounted
COPY --chown=10001:10001 jobs ./jobs
COPY --chown=10001:10001 scripts/sample_corpus.py ./scripts/
RUN python scripts/sample_corpus.py data/docs --shards 8

ENTRYPOINT ["batchscore"]
CMD ["run", "jobs/summarize.toml"]
