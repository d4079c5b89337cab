package inbox

// SetTestHookAfterBatchSelect sets (nil: clears) the hook ProcessBatch runs between the MySQL
// duplicate-finding SELECT ... FOR UPDATE and the multi-row INSERT (on MariaDB: before the
// INSERT IGNORE ... RETURNING). Test builds only.
func SetTestHookAfterBatchSelect(f func()) { testHookAfterBatchSelect = f }
