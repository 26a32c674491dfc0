# The one image of slicekeeper: every TPU pod and the operator run it.
#   TPU pod:   python -m slicekeeper.supervisor --in-pod -- <the user's command>   (operator/render.py)
#   operator:  slicekeeper operator                (charts/slicekeeper/templates/operator.yaml)
# No ENTRYPOINT or CMD: each runs its own command.
#
#   docker build -t ghcr.io/slicekeeper/slicekeeper:dev .
#   docker build --build-arg EXTRA_PACKAGES='jax[tpu]' -t ...   # on TPU nodes: JAX for TPU
#
# The [jax] extra brings CPU JAX (the reference trainer on kind, docs/kind.md); the [operator] extra
# brings kopf and the Kubernetes client. For examples/trainingjob-torch.yaml add torch, its CPU build
# from PyTorch's index (PyPI's is CUDA's):
#   docker build \
#     --build-arg EXTRA_PACKAGES='torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu' ...
# The image's user is numeric (10001) so that the kubelet can enforce `runAsNonRoot` (the operator's
# Deployment sets runAsUser: 10001 to match).

# Build the wheel from the sources only (.dockerignore keeps tests, docs and caches out).
FROM python:3.12-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY slicekeeper/ slicekeeper/
COPY operator/ operator/
COPY supervisor/ supervisor/
COPY workload/ workload/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.12-slim
ARG EXTRAS=jax,operator
ARG EXTRA_PACKAGES=
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=wheel /wheels /wheels
# EXTRA_PACKAGES is left unquoted on purpose: it may name several packages.
RUN pip install --no-cache-dir "$(ls /wheels/slicekeeper-*.whl)[${EXTRAS}]" ${EXTRA_PACKAGES} \
    && rm -rf /wheels \
    && groupadd --gid 10001 slicekeeper \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/slicekeeper slicekeeper
USER 10001:10001
WORKDIR /home/slicekeeper
