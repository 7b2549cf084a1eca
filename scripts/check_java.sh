#!/usr/bin/env bash
# Fails unless a Java 17+ runtime is available (PySpark 4 needs it).
# Uses $JAVA_HOME/bin/java when JAVA_HOME is set (as PySpark does), else `java` on PATH.
set -euo pipefail

required=17

if [[ -n "${JAVA_HOME:-}" ]]; then
    java_bin="${JAVA_HOME}/bin/java"
    where="JAVA_HOME=${JAVA_HOME}"
    if [[ ! -x "${java_bin}" ]]; then
        echo "Java ${required}+ is required (no executable ${java_bin}; ${where})." >&2
        echo "Install a JDK ${required}+ (e.g. Debian: apt-get install openjdk-17-jre-headless) or fix JAVA_HOME." >&2
        exit 1
    fi
else
    where="java on PATH"
    if ! java_bin="$(command -v java)"; then
        echo "Java ${required}+ is required (java not found on PATH)." >&2
        echo "Install a JDK ${required}+ (e.g. Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME." >&2
        exit 1
    fi
fi

# First line looks like: openjdk version "17.0.15" 2025-04-15   or   java version "1.8.0_292"
output="$("${java_bin}" -version 2>&1 || true)"
version_line="${output%%$'\n'*}"
if [[ ! "${version_line}" =~ version\ \"([^\"]*)\" ]]; then
    echo "Java ${required}+ is required (could not parse the version of ${java_bin}: '${version_line}')." >&2
    exit 1
fi
version="${BASH_REMATCH[1]}"
major="${version%%.*}"
if [[ "${major}" == "1" ]]; then # 1.8.0_292 style: the major version is the second field
    rest="${version#1.}"
    major="${rest%%.*}"
fi
major="${major%%[!0-9]*}"
if [[ -z "${major}" || "${major}" -lt "${required}" ]]; then
    echo "Java ${required}+ is required (found version ${version} at ${java_bin}; ${where})." >&2
    exit 1
fi
echo "Java ${version} OK (${java_bin})"
