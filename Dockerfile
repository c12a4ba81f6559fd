# The image deploy/ runs, gas:<version>: `docker build -t gas:0.1.0 .` (docs/image.md), or
# scripts/build-image.sh, which builds the same image where no registry serves the base.
#
# Build a wheel with the full toolchain, install it into a clean virtualenv, and ship only
# that virtualenv on a slim base: no compilers or pip caches in the final image.
FROM python:3.11-slim AS build
WORKDIR /src
COPY setup.py README.md ./
COPY gas ./gas
COPY scripts/image-prune.sh /tmp/
RUN python -m venv /opt/gas \
 && /opt/gas/bin/pip install --no-cache-dir '.[labeler,node]' \
 && /opt/gas/bin/pip uninstall --yes --quiet pip setuptools \
 && sh /tmp/image-prune.sh /opt/gas

FROM python:3.11-slim
# libudev for card discovery (gas node, gas label-node); gas serve does not need it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libudev1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/gas /opt/gas
RUN groupadd --gid 10001 gas && useradd --uid 10001 --gid gas --no-create-home gas
USER 10001:10001
ENV PATH=/opt/gas/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
EXPOSE 9001
ENTRYPOINT ["gas"]
CMD ["serve"]
