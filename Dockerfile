# The operator image: slim, pinned, non-root, CPU-only torch, no build tools in the final stage.
# Build from the repository root: docker build -t fleettune/operator:0.1.0 .
FROM python:3.11.10-slim-bookworm AS build
# CPU-only PyTorch wheels: the default index's Linux build drags in GBs of CUDA libraries
# the operator never uses (it only fits small Gaussian processes).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.15.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
WORKDIR /src
COPY pyproject.toml README.md ./
# The runtime package only: the development tools (dev/: local cluster, simulator, demo,
# benchmarks) are a distribution of their own and never copied, and the check says so.
COPY operator ./operator
COPY job_image/fleettune_job ./job_image/fleettune_job
# NVRTC comes with it (a library, no GPU needed): the operator compiles users' kernels up front.
# So do the CUDA headers, checked here by compiling an include of one: without them the
# operator's check passes any kernel that includes a header (it cannot tell a missing header
# of this image from one the source wrongly names), and its errors show only in the trials.
# --build-arg EXTRAS=triton adds Triton's compiler (about 1 GB), with which the operator compiles
# a Triton kernel for each pool's GPU before any Job (docs/operations/install.md). The package is
# this checkout, which hadolint takes for an unpinned one.
ARG EXTRAS=""
# hadolint ignore=DL3013
RUN pip install ".${EXTRAS:+[$EXTRAS]}" && python -c "import fleettune.controller.handlers, importlib.util, pathlib; \
from fleettune_job import nvrtc; assert nvrtc.available(), 'libnvrtc not found'; \
include = nvrtc.cuda_include_dir(); \
assert include and (pathlib.Path(include) / 'cuda_fp16.h').is_file(), f'no CUDA headers (cuda_fp16.h): {include}'; \
probe = nvrtc.compile_source('#include <cuda_fp16.h>\n', [*nvrtc.header_options(), nvrtc.arch_option('8.0', virtual=True)]); \
assert probe.ok, probe.log; \
assert importlib.util.find_spec('fleettune_dev') is None"

FROM python:3.11.10-slim-bookworm
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["fleettune", "operator", "--liveness", "http://0.0.0.0:8081/healthz"]
