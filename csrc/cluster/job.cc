#include "cluster/job.h"

#include "common/text.h"

namespace rs::cluster {

std::string resolve_job_id(const Lookup& env, const std::string& explicit_id) {
  if (std::string id = rs::trim(explicit_id); !id.empty()) return id;
  for (const char* var : {"RS_JOB_ID", "CLOUD_ML_JOB_ID"}) {
    if (std::optional<std::string> v = env(var)) {
      if (std::string id = rs::trim(*v); !id.empty()) return id;
    }
  }
  return "local";
}

}  // namespace rs::cluster
