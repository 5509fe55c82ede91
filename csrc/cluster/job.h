// The job id of a worker or reducer, the one rule for the library and the NCCL plugin: an explicit
// id if not blank, else RS_JOB_ID, else CLOUD_ML_JOB_ID (Vertex AI sets it per custom job), else
// "local". Blank (empty or only whitespace) counts as unset; the id is trimmed.
#pragma once

#include <string>

#include "cluster/spec.h"

namespace rs::cluster {

std::string resolve_job_id(const Lookup& env, const std::string& explicit_id = "");

}  // namespace rs::cluster
